"""PNG plots of a benchmark: solve time vs GPUs, gain vs model size, gap vs time limit."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from haap_milp.methods import EXACT

OTHER_STYLE = ("black", "x")  # a method without its own style below
STYLE = {"cpsat": ("tab:blue", "o"), "milp": ("tab:orange", "s"), "dp": ("tab:green", "^"),
         "uniform": ("tab:gray", "v")}


def num(x) -> float | None:
    """A CSV cell as a float (None when empty or not a number)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_solve_time(rows: list[dict], path: Path) -> Path:
    """Solve wall time against cluster GPUs, one series per method (and time limit), log-log."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        g, w = num(r["cluster_gpus"]), num(r["wall_s"])
        if g and w is not None and r["status"] not in ("ERROR", "INFEASIBLE"):  # presolve-proven: not a solve
            name = r["method"] + (f" ({r['time_limit_s']} s)" if r["time_limit_s"] else "")
            series[name].append((g, max(w, 1e-3)))
    for name, pts in sorted(series.items()):
        color, marker = STYLE.get(name.split()[0], OTHER_STYLE)
        ax.scatter(*zip(*pts), color=color, marker=marker, alpha=0.35, s=18)
        by_g = defaultdict(list)
        for g, w in pts:
            by_g[g].append(w)
        xs = sorted(by_g)
        ls = ":" if "(" in name and name != _longest(series, name) else "-"
        ax.plot(xs, [statistics.median(by_g[x]) for x in xs], color=color, marker=marker, ls=ls,
                label=f"{name} median")
    ax.set(xscale="log", yscale="log", xlabel="GPUs in the cluster", ylabel="solve wall time (s)",
           title="Solve time vs cluster size (points: runs; lines: median; infeasible excluded)")
    _int_ticks(ax, sorted({g for pts in series.values() for g, _ in pts}))
    ax.grid(True, which="both", alpha=0.3)
    if series:
        ax.legend(fontsize=7)
    return _save(fig, plt, path)


def _longest(series: dict, name: str) -> str:
    """The series of the same method with the largest time limit (drawn solid)."""
    method = name.split()[0]
    same = [n for n in series if n.split()[0] == method]
    return max(same, key=lambda n: num(n.split("(")[-1].split()[0]) or 0)


def plot_gain(recs: list[dict], path: Path) -> Path:
    """Throughput gain of the exact plan over DP and over uniform, against model size (parameters)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=False)
    for ax, key, title in ((axes[0], "gain_dp", "exact vs DP"), (axes[1], "gain_uniform", "exact vs uniform")):
        clusters = sorted({r["cluster"] for r in recs})
        cmap = plt.get_cmap("tab10")
        for i, c in enumerate(clusters):
            pts = [(r["params_b"], 100 * r[key], r["moe"]) for r in recs
                   if r["cluster"] == c and r[key] is not None and r["params_b"]]
            for moe in (False, True):
                sel = [(x, y) for x, y, m in pts if m == moe]
                if sel:
                    ax.scatter(*zip(*sel), color=cmap(i % 10), marker="D" if moe else "o", s=28, alpha=0.8,
                               label=c if not moe or not any(not m for _, _, m in pts) else None)
        ax.axhline(0, color="black", lw=0.8)
        ax.set(xscale="log", xlabel="model parameters (billions; diamonds: MoE, total)",
               ylabel=f"{title} throughput gain (%)", title=f"{title}: T_base / T_exact − 1")
        _int_ticks(ax, [x for x in (1, 3, 10, 30, 100, 300, 1000)
                        if any(r["params_b"] and x / 3.5 <= r["params_b"] <= x * 3.5 for r in recs)])
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(4, len(labels)))
    return _save(fig, plt, path, rect=(0, 0.06 + 0.04 * ((len(labels) + 3) // 4), 1, 1))


def plot_gap(rows: list[dict], path: Path) -> Path:
    """Proven gap of each exact run against its time limit (lines join the runs of one task)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in EXACT:
        color, marker = STYLE.get(m, OTHER_STYLE)
        per_task: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        for r in rows:
            lim, gap = num(r["time_limit_s"]), num(r["gap"])
            if r["method"] == m and lim is not None and gap is not None:
                per_task[(r["model"], r["cluster"], r["gbs"], r["seq"])].append((lim, 100 * gap))
        for pts in per_task.values():
            pts.sort()
            ax.plot(*zip(*pts), color=color, alpha=0.25, lw=0.8, marker=".")
        by_lim = defaultdict(list)
        for pts in per_task.values():
            for lim, g in pts:
                by_lim[lim].append(g)
        if by_lim:
            xs = sorted(by_lim)
            ax.plot(xs, [statistics.median(by_lim[x]) for x in xs], color=color, marker=marker, lw=2,
                    label=f"{m} median ({len(per_task)} tasks)")
    ax.set(xscale="log", xlabel="time limit (s)", ylabel="proven gap (%)", title="Proven gap vs time limit")
    _int_ticks(ax, sorted({num(r["time_limit_s"]) for r in rows if num(r["time_limit_s"]) is not None}))
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _save(fig, plt, path)


def _int_ticks(ax, values) -> None:
    """Plain-number major ticks at the given values on a log x axis."""
    from matplotlib.ticker import NullFormatter

    if values:
        ax.set_xticks(values, [format(v, "g") for v in values])
        ax.xaxis.set_minor_formatter(NullFormatter())


def _save(fig, plt, path: Path, rect=(0, 0, 1, 1)) -> Path:
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(rows: list[dict], recs: list[dict], out_dir: Path) -> list[Path]:
    return [plot_solve_time(rows, out_dir / "solve_time_vs_gpus.png"),
            plot_gain(recs, out_dir / "gain_vs_model_size.png"),
            plot_gap(rows, out_dir / "gap_vs_time_limit.png")]
