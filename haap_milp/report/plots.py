"""Plots (matplotlib, headless): the pipeline timeline and memory per stage, PNG and SVG.

Both take plain data — a ``simulate.SimulationResult`` and a list of ``StageMemory`` (or dicts with
the same keys) — so they do not depend on the estimator's internals. Figures are built with
``matplotlib.figure.Figure`` (no pyplot state, no display needed: the Agg canvas renders PNG).
"""

from __future__ import annotations

import io
import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from haap_milp.simulate import SimulationResult

log = logging.getLogger(__name__)

FORMATS = ("png", "svg")
COLORS = {"F": "#4C9BE8", "B": "#F28E2B", "sync": "#9D9D9D", "send_fwd": "#76B7B2", "send_bwd": "#E15759"}
MEMORY_PARTS = (("weights_gib", "weights", "#4E79A7"), ("grads_gib", "gradients", "#59A14F"),
                ("optimizer_gib", "optimizer state", "#EDC948"), ("activations_gib", "activations", "#E15759"),
                ("overhead_gib", "overhead", "#BAB0AC"))
MAX_LABELLED_BARS = 160  # micro-batch numbers on bars only when they stay readable


@dataclass(frozen=True)
class StageMemory:
    """Peak memory of one GPU of a stage, by part (GiB)."""

    label: str
    weights_gib: float = 0.0
    grads_gib: float = 0.0
    optimizer_gib: float = 0.0
    activations_gib: float = 0.0
    overhead_gib: float = 0.0
    capacity_gib: float = 0.0  # the GPU's memory
    usable_gib: float | None = None  # capacity minus headroom (None: not drawn)

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.grads_gib + self.optimizer_gib + self.activations_gib + self.overhead_gib


def _as_stage_memory(x: StageMemory | Mapping) -> StageMemory:
    if isinstance(x, StageMemory):
        return x
    known = {k: x[k] for k in StageMemory.__dataclass_fields__ if k in x}
    return StageMemory(**known)


def _save(fig: Figure, path_stem: str | Path) -> list[Path]:
    """Render every format in memory, then write each file atomically (``outputs.write_atomic``)."""
    from haap_milp.outputs import write_atomic

    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out, rendered = [], []
    with matplotlib.rc_context({"svg.hashsalt": "haap", "svg.fonttype": "none"}):
        for fmt in FORMATS:
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=130, bbox_inches="tight",
                        metadata={"Date": None} if fmt == "svg" else {"Software": None})
            rendered.append((stem.with_name(stem.name + "." + fmt), buf.getvalue()))
    for path, data in rendered:
        write_atomic(path, data, flag="plot")
        out.append(path)
    log.info("wrote %s", ", ".join(map(str, out)))
    return out


def plot_timeline(sim: SimulationResult, path_stem: str | Path, title: str | None = None,
                  show_transfers: bool = True) -> list[Path]:
    """Gantt chart of one iteration: forward/backward per stage per micro-batch, DP sync, and (thin,
    under each stage) the transfers it sends. Returns the PNG and SVG paths."""
    p = sim.num_stages
    compute = [e for e in sim.events if e.kind in ("F", "B")]
    width = min(18.0, 6.0 + 0.08 * len(compute) / max(p, 1))
    fig = Figure(figsize=(width, 1.0 + 0.6 * p))
    ax = fig.add_subplot()
    labelled = len(compute) <= MAX_LABELLED_BARS
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}  # one broken_barh call per (row, kind)
    for e in sim.events:
        if e.kind in ("F", "B", "sync") or show_transfers:
            spans.setdefault((p - 1 - e.stage, e.kind), []).append((e.start_s, e.end_s - e.start_s))
        if labelled and e.kind in ("F", "B") and e.end_s > e.start_s:
            ax.text((e.start_s + e.end_s) / 2, p - 1 - e.stage - 0.05, str(e.microbatch), ha="center",
                    va="center", fontsize=6, color="black" if e.chunk == 0 else "white")
    for (row, kind), xr in spans.items():
        if kind in ("F", "B", "sync"):
            ax.broken_barh(xr, (row - 0.35, 0.6), facecolors=COLORS[kind], edgecolors="white",
                           linewidth=0.4 if labelled else 0.0)
        else:
            ax.broken_barh(xr, (row - 0.45, 0.08), facecolors=COLORS[kind])
    labels = list(sim.stage_labels) if len(sim.stage_labels) == p else [f"stage {j}" for j in range(p)]
    ax.set_yticks(range(p), [f"{labels[j]}\n{sim.busy_fraction[j]:.0%} busy" for j in range(p)][::-1],
                  fontsize=8)
    ax.set_xlim(0, sim.iteration_time_s * 1.01)
    ax.set_ylim(-0.6, p - 0.4)
    ax.set_xlabel("time in the iteration (s)")
    head = title or f"{sim.schedule}" + (f" (vpp {sim.vpp})" if sim.vpp > 1 else "")
    ax.set_title(f"{head}: {sim.num_microbatches} micro-batches, iteration {sim.iteration_time_s:.3g} s "
                 f"(closed form {sim.closed_form_s:.3g} s)", fontsize=10)
    handles = [Patch(color=COLORS["F"], label="forward"), Patch(color=COLORS["B"], label="backward"),
               Patch(color=COLORS["sync"], label="DP sync")]
    if show_transfers and any(e.kind.startswith("send") for e in sim.events):
        handles += [Patch(color=COLORS["send_fwd"], label="send activation"),
                    Patch(color=COLORS["send_bwd"], label="send gradient")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path_stem)


def plot_memory(stages: Sequence[StageMemory | Mapping], path_stem: str | Path, title: str | None = None
                ) -> list[Path]:
    """Stacked bars of peak memory per GPU of each stage, with the capacity and usable (capacity minus
    headroom) marks. Returns the PNG and SVG paths."""
    rows = [_as_stage_memory(s) for s in stages]
    if not rows:
        raise ValueError("plot_memory needs at least one stage")
    fig = Figure(figsize=(max(5.0, 1.1 * len(rows) + 2.5), 4.2))
    ax = fig.add_subplot()
    xs = range(len(rows))
    bottom = [0.0] * len(rows)
    for key, name, color in MEMORY_PARTS:
        vals = [getattr(r, key) for r in rows]
        if any(vals):
            ax.bar(xs, vals, bottom=bottom, color=color, label=name, width=0.6)
            bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        if r.capacity_gib:
            ax.hlines(r.capacity_gib, i - 0.4, i + 0.4, colors="black", linewidth=1.8,
                      label="capacity" if i == 0 else None)
        if r.usable_gib is not None:
            ax.hlines(r.usable_gib, i - 0.4, i + 0.4, colors="black", linestyles="dashed", linewidth=1.0,
                      label="capacity - headroom" if i == 0 else None)
        ax.text(i, r.total_gib, f"{r.total_gib:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [r.label for r in rows], fontsize=8, rotation=20 if len(rows) > 6 else 0)
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title or "peak memory per stage", fontsize=10)
    top = max(max(r.total_gib, r.capacity_gib) for r in rows)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path_stem)


def memory_bars(plan, estimate, cluster=None) -> list[StageMemory]:
    """StageMemory rows from an ``estimator.PlanEstimate`` (its per-stage ``*_gib`` breakdown) and, when the
    cluster is given, each GPU type's full memory as the capacity line (usable = after headroom)."""
    rows = []
    for j, (st, se) in enumerate(zip(plan.stages, estimate.stages)):
        b = se.breakdown
        full = cluster.gpu(st.gpu_type).memory_gib if cluster is not None else se.capacity_gib
        rows.append(StageMemory(f"{j}: {st.gpu_type}\ntp{st.tp} dp{st.dp} {st.num_layers}L",
                                b.get("weights_gib", 0.0), b.get("grads_gib", 0.0), b.get("optimizer_gib", 0.0),
                                b.get("activations_gib", 0.0), b.get("overhead_gib", 0.0), full, se.capacity_gib))
    return rows


def plot_folder(folder: str | Path, sim: SimulationResult, memory_rows: Sequence[StageMemory | Mapping],
                flag: str = "--plot") -> list[Path]:
    """timeline.{png,svg} and memory.{png,svg} into ``folder``, all four or none (``outputs.write_dir_atomic``:
    drawn in a scratch folder first, then renamed into place; other files in ``folder`` are left alone)."""
    from haap_milp.outputs import write_dir_atomic

    with tempfile.TemporaryDirectory(prefix="haap-plots-") as scratch:
        files = plot_timeline(sim, Path(scratch) / "timeline") + plot_memory(memory_rows, Path(scratch) / "memory")
        return write_dir_atomic(folder, {f.name: f.read_bytes() for f in files}, flag=flag)


def plot_pareto(points: Sequence[Mapping], measure: str, path_stem: str | Path, title: str | None = None) -> list[Path]:
    """Time vs cost (or energy) frontier: one marker per point (``iteration_time_s`` and ``usd_per_iteration`` or
    ``joules_per_token``), labelled with its GPUs. The frontier is monotone in the GPUs' rate ($/h, idle W);
    the product with T, plotted here, need not be: its least point is the cost (energy) optimum."""
    key, label = (("usd_per_iteration", "$ per iteration") if measure == "cost"
                  else ("joules_per_token", "J per token"))
    pts = sorted((p for p in points if p.get(key) is not None), key=lambda p: p["iteration_time_s"])
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.subplots()
    xs, ys = [p["iteration_time_s"] for p in pts], [p[key] for p in pts]
    ax.plot(xs, ys, "o:", color=COLORS["F"])
    if pts:
        low = min(pts, key=lambda p: p[key])
        ax.plot([low["iteration_time_s"]], [low[key]], "o", color=COLORS["send_bwd"], label=f"least {label}")
        ax.legend(loc="best", fontsize=8)
    for p in pts:
        ax.annotate(" + ".join(f"{n} {t}" for t, n in p.get("gpus", {}).items()), (p["iteration_time_s"], p[key]),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("iteration time, s")
    ax.set_ylabel(label)
    ax.set_title(title or f"time vs {measure}: each point the fastest plan within its budget")
    ax.grid(alpha=0.3)
    return _save(fig, path_stem)


def pareto_folder(folder: str | Path, points: Sequence[Mapping], measure: str, flag: str = "--plot") -> list[Path]:
    """pareto.{png,svg} into ``folder``, both or none (as ``plot_folder``)."""
    from haap_milp.outputs import write_dir_atomic

    with tempfile.TemporaryDirectory(prefix="haap-plots-") as scratch:
        files = plot_pareto(points, measure, Path(scratch) / "pareto")
        return write_dir_atomic(folder, {f.name: f.read_bytes() for f in files}, flag=flag)
