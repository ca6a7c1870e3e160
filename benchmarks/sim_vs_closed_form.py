"""How far the planner's closed form (eq. T1) is from the event replay, over random instances.

Run: ``.venv/bin/python benchmarks/sim_vs_closed_form.py [--out benchmarks/results/sim_vs_closed_form.md]``.
Each cell: relative difference (simulated - formula) / formula over ``N`` random instances
(mean, min, max). Stage times t_j = U(1 - a, 1 + a) (imbalance a), boundaries c_j = r * mean(t) * U(0.5, 1.5)
(link ratio r), DP sync s_j = U(0, 0.5) * mean(t). Forward 1/3, backward 2/3 of t_j. "Planner closed form":
eq. T1 for 1F1B and GPipe, eq. I1 (pipeline.interleaved_iteration_time, what the search optimises since
vpp is a search dimension) for interleaved; the replay follows Megatron-Core 0.16's interleaved order.
Not a test: it writes a results file and prints the numbers of one run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from haap_milp.estimator.schedule import iteration_time
from haap_milp.simulate import inflight_bound_iteration_s, simulate

N = 12


def instance(rng: random.Random, p: int, a: float, r: float) -> tuple[list, list, list]:
    t = [rng.uniform(1 - a, 1 + a) for _ in range(p)]
    mean_t = sum(t) / p
    c = [r * mean_t * rng.uniform(0.5, 1.5) for _ in range(p - 1)]
    s = [rng.uniform(0, 0.5) * mean_t for _ in range(p)]
    return t, c, s


ALL_SCHEDULES = {"1f1b", "gpipe", "interleaved"}


def cell(rng, schedule, p, m, a, r, duplex="full", vpp=1, raw: list | None = None
         ) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """(mean, min, max) of the relative difference to eq. T1 and to the in-flight refinement."""
    d_t1, d_ref = [], []
    for _ in range(N):
        t, c, s = instance(rng, p, a, r)
        wrap = max(c) if c else 0.0
        res = simulate([x / 3 for x in t], [2 * x / 3 for x in t], c, s, num_microbatches=m,
                       schedule=schedule, duplex=duplex, vpp=vpp, wrap_p2p_s=wrap)
        closed = iteration_time(schedule, t, c, s, m, vpp, wrap)  # eq. T1 for gpipe/1f1b
        d_t1.append((res.iteration_time_s - closed) / closed)
        ref = inflight_bound_iteration_s(t, c, s, m, duplex)
        d_ref.append((res.iteration_time_s - ref) / ref)
    if raw is not None:
        raw.extend(d_t1)
    return ((statistics.fmean(d_t1), min(d_t1), max(d_t1)), (statistics.fmean(d_ref), min(d_ref), max(d_ref)))


def _fmt(x: tuple[float, float, float]) -> str:
    return f"{x[0]:+.3f} [{x[1]:+.3f}, {x[2]:+.3f}]"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim_vs_closed_form.md")
    ap.add_argument("--schedules", nargs="+", default=["1f1b", "gpipe", "interleaved"],
                    help="sections to run (each keeps its own random stream, so a subset reproduces its rows)")
    args = ap.parse_args(argv)
    rng = random.Random(0)
    lines = ["# Event replay vs closed form (eq. T1)", "",
             (f"relative difference (sim - formula) / formula; mean [min, max] over {N} random instances. "
             "In-flight refinement: haap_milp.simulate.inflight_bound_iteration_s (1F1B only)."), ""]
    for schedule, duplex, vpp in (("1f1b", "full", 1), ("1f1b", "half", 1), ("gpipe", "full", 1),
                                  ("interleaved", "full", 2), ("interleaved", "full", 4)):
        if schedule not in args.schedules:
            continue
        if set(args.schedules) != ALL_SCHEDULES:  # a subset: one stream per section (the full run keeps one)
            rng = random.Random(f"{schedule}-{duplex}-{vpp}")
        section: list[float] = []
        lines += [f"## {schedule} (vpp {vpp}), links {duplex}-duplex", "",
                  ("| P | M | imbalance a | link ratio r | vs planner closed form: mean [min, max] | "
                  "vs in-flight refinement (1F1B) |"),
                  "|---|---|---|---|---|---|"]
        for p in ((4, 8) if vpp > 1 else (2, 4, 8, 16)):
            for m in sorted({p, 4 * p, 64}):
                for a in (0.0, 0.3, 0.6):
                    for r in (0.0, 0.1, 0.5, 2.0):
                        t1, ref = cell(rng, schedule, p, m, a, r, duplex, vpp, section)
                        lines.append(f"| {p} | {m} | {a} | {r} | {_fmt(t1)} | {_fmt(ref) if schedule == '1f1b' else 'n/a'} |")
        lines += ["", (f"All {len(section)} instances of this section vs the planner closed form: mean "
                  f"{statistics.fmean(section):+.3f}, mean |.| {statistics.fmean(map(abs, section)):.3f}, min "
                  f"{min(section):+.3f}, max {max(section):+.3f}."), ""]
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
