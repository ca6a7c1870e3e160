"""Solve time under a budget (eq. W1) and re-planning time (issue 16), measured in one run.

For each instance: the unbudgeted time optimum (CP-SAT, 2 threads, LIMIT s), then the fastest plan under a
budget of 90 %, 75 % and 50 % of that plan's $/h (one step of the sweep, same limit): status, proven gap,
wall time, and the ratio of budgeted to unbudgeted wall time. Then `replan` after losing one node of the
first GPU type: wall time of the whole re-plan (solve on the new cluster, degraded plan, migration) with a
10 s deadline. Everything in this process (no start-up time counted).

Usage:  .venv/bin/python benchmarks/cost_objectives.py [--limit 10]
Writes benchmarks/results/cost_objectives.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from haap_milp import economics, frontier, planner, replan
from haap_milp.catalog import load_cluster, load_model
from haap_milp.catalog.prices import load_prices
from haap_milp.deadline import Deadline
from haap_milp.specs import SolveOptions, TrainingSpec

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "cost_objectives.md"
# (model, cluster, gbs, the cluster after losing one node of its first type)
INSTANCES = (("llama3-8b", "h100-a100-32", 512, "h100-80g:8,a100-80g:16"),
             ("llama3-70b", "hetero3-1024", 1024, "h100-80g:248,a100-80g:512,a100-40g:256"))


def _row(name, fr_or_out, wall, base_wall=None):
    if isinstance(fr_or_out, frontier.Frontier):
        p = fr_or_out.points[0] if fr_or_out.points else None
        r = p.outcome.result if p else None
    else:
        r = fr_or_out.result
    status = r.status.value if r else "INFEASIBLE"
    t = "-" if r is None or r.objective_s is None else f"{r.objective_s:.3f}"
    gap = "-" if r is None or r.gap is None else f"{100 * r.gap:.2f} %"
    ratio = "" if base_wall is None else f"{wall / base_wall:.2f}"
    return f"| {name} | {status} | {t} | {gap} | {wall:.2f} | {ratio} |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=10.0)
    a = ap.parse_args()
    book = load_prices()
    lines = ["# Budgeted solves and re-planning (benchmarks/cost_objectives.py)", "",
             f"CP-SAT, 2 threads, {a.limit:g} s per solve, seq 4096; one process, start-up not counted.", ""]
    for model, cluster, gbs, lost in INSTANCES:
        m, c = load_model(model), load_cluster(cluster)
        tr = TrainingSpec(global_batch_size=gbs, seq_len=4096)
        opts = SolveOptions(time_limit_s=a.limit, threads=2)
        ctx = planner.Context.build(m, c, tr, opts)
        t0 = time.perf_counter()
        base = planner.orchestrate(ctx, [("cpsat", None)]).outcomes[0]
        base_wall = time.perf_counter() - t0
        rate = economics.usd_per_hour(base.result.plan, book)
        lines += [f"## {model} on {cluster} (gbs {gbs})", "",
                  "| run | status | T s | proven gap | wall s | wall / unbudgeted |", "|---|---|---|---|---|---|",
                  _row(f"no budget ({rate:,.2f} $/h used)", base, base_wall)]
        for share in (0.9, 0.75, 0.5):
            t0 = time.perf_counter()
            fr = frontier.sweep(ctx, book, "cost", max_points=1, cap=share * rate,
                                deadline=Deadline(a.limit + 1.0))
            lines.append(_row(f"budget {share:.0%} ({share * rate:,.2f} $/h)", fr, time.perf_counter() - t0, base_wall))
        t0 = time.perf_counter()
        r = replan.replan(base.result.plan, m, tr, load_cluster(lost), opts.model_copy(update={"time_limit_s": 10.0}),
                          book, deadline=Deadline(10.0))
        wall = time.perf_counter() - t0
        mig = r.migration
        summary = (f"replan after losing one node ({lost}): {wall:.2f} s wall, status "
                   f"{r.new.result.status.value}, gap {100 * (r.new.result.gap or 0):.2f} %, new T "
                   f"{r.new.estimate.iteration_time_s:.3f} s, degraded T "
                   f"{'-' if r.degraded_time_s is None else format(r.degraded_time_s, '.3f')} s, migration "
                   f"{mig.bytes_moved / 1e9:,.1f} GB in {mig.time_s:.2f} s (${mig.usd:.4g}), choice {r.choice}")
        lines += ["", summary, ""]
        print("\n".join(lines[-12:]), flush=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
