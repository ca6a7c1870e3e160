"""Solve time under a budget (eq. W1), the energy objective's proven gap, and re-planning time (issue 16).

For each instance: the unbudgeted time optimum (CP-SAT, 2 threads, LIMIT s), then the fastest plan under a
budget of 90 %, 75 % and 50 % of that plan's $/h (one step of the sweep, same limit): status, proven gap,
wall time, and the ratio of budgeted to unbudgeted wall time. Then `--objective energy` and `--objective cost`
(the band search of eqs. EB1-EB5 with eq. CD5's bound, --objective-limit s each): band solves, eq. CD4 runs,
the proven gap. Then `replan` after
losing one node of each GPU type in turn, with the CLI's default deadline (replan.DEFAULT_TIME_LIMIT_S):
wall time of the whole re-plan (presolve, degraded plan, warm-started solve, migration). Everything in this
process (no start-up time counted: add ~1-1.5 s for the CLI).

Usage:  .venv/bin/python benchmarks/cost_objectives.py [--limit 10] [--objective-limit 10] [--cli-defaults]
                                                      [--price-kind on-demand|spot] [--out FILE]
Writes benchmarks/results/cost_objectives.md (or --out). --cli-defaults: the space `haap-solve solve` searches
(specs.solve.SOLVE_SPACE: eq. D2's interleaved copies, cp and ZeRO defaults) instead of SolveOptions()'s.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from haap_milp import economics, frontier, objectives, planner, replan
from haap_milp.catalog import load_cluster, load_model
from haap_milp.catalog.prices import load_prices
from haap_milp.deadline import Deadline
from haap_milp.specs import SolveOptions, TrainingSpec
from haap_milp.specs.solve import SOLVE_SPACE

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "cost_objectives.md"
ENERGY_LIMIT = 10.0  # s for the whole energy (cost) objective (--objective-limit): the band search (eqs. EB1-EB5)
# (model, cluster, gbs, the cluster after losing one node of each type)
INSTANCES = (("llama3-8b", "h100-a100-32", 512, ("h100-80g:8,a100-80g:16", "h100-80g:16,a100-80g:8")),
             ("llama3-70b", "hetero3-1024", 1024, ("h100-80g:248,a100-80g:512,a100-40g:256",
                                                   "h100-80g:256,a100-80g:504,a100-40g:256",
                                                   "h100-80g:256,a100-80g:512,a100-40g:248")))


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


def _energy_line(ctx, book, limit: float) -> str:
    t0 = time.perf_counter()
    ans = objectives.plan_for(ctx, book, objectives.Goal("energy", step=0.05), deadline=Deadline(limit))
    d = ans.doc
    gap = d.get("objective_gap")
    return (f"`--objective energy` ({limit:g} s, {d.get('search', 'sweep')} search): "
            f"{time.perf_counter() - t0:.2f} s wall, {d.get('solves', 0)} band solve(s), "
            f"{d.get('dp_runs', 0)} eq. CD4 run(s), {d['points_searched']} plan(s), {d.get('joules_per_iteration', 0) / 1e3:,.1f} kJ per iteration, proven "
            f"bound {(d.get('joules_per_iteration_lower_bound') or 0) / 1e3:,.1f} kJ, gap "
            f"{'-' if gap is None else f'{100 * gap:.2f} %'} ({d['stopped']})")


def _cost_line(ctx, book, limit: float) -> str:
    t0 = time.perf_counter()
    ans = objectives.plan_for(ctx, book, objectives.Goal("cost"), deadline=Deadline(limit))
    d = ans.doc
    gap = d.get("objective_gap")
    return (f"`--objective cost` ({limit:g} s, {d.get('search', 'sweep')} search): "
            f"{time.perf_counter() - t0:.2f} s wall, {d.get('solves', 0)} band solve(s), "
            f"{d.get('dp_runs', 0)} eq. CD4 run(s), ${d.get('usd_per_iteration') or 0:,.4f} per iteration, proven bound "
            f"${d.get('usd_per_iteration_lower_bound') or 0:,.4f}, gap "
            f"{'-' if gap is None else f'{100 * gap:.2f} %'} ({d['stopped']})")


def _replan_line(base, m, tr, opts, lost, book) -> str:
    t0 = time.perf_counter()
    r = replan.replan(base.result.plan, m, tr, load_cluster(lost), opts, book,
                      deadline=Deadline(replan.DEFAULT_TIME_LIMIT_S))
    wall = time.perf_counter() - t0
    mig = r.migration
    mig_s = "-" if mig is None else f"{mig.bytes_moved / 1e9:,.1f} GB in {mig.time_s:.2f} s (${mig.usd:.4g})"
    deg = "-" if r.degraded_time_s is None else f"{r.degraded_time_s:.3f}"
    new_t = "-" if r.new.estimate is None else f"{r.new.estimate.iteration_time_s:.3f}"
    gap = "-" if r.new.result.gap is None else f"{100 * r.new.result.gap:.2f} %"
    return f"| {lost} | {wall:.2f} | {r.new.result.status.value} | {gap} | {new_t} | {deg} | {mig_s} | {r.choice} |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=10.0)
    ap.add_argument("--objective-limit", type=float, default=ENERGY_LIMIT, help="s for each --objective energy|cost")
    ap.add_argument("--cli-defaults", action="store_true", help="search SOLVE_SPACE, as `haap-solve solve` does")
    ap.add_argument("--price-kind", default="on-demand", help="on-demand | spot (the catalog's price to use)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    book = load_prices(kind=a.price_kind)
    load = os.getloadavg()
    lines = ["# Budgeted solves, the energy objective and re-planning (benchmarks/cost_objectives.py)", "",
             (f"CP-SAT, 2 threads, {a.limit:g} s per solve, seq 4096, {book.kind} prices ({book.source}); one "
              f"process, start-up not counted; load average at start {load[0]:.1f} on {os.cpu_count()} cores; "
              f"{'the CLI defaults (SOLVE_SPACE)' if a.cli_defaults else 'SolveOptions() space'}; "
              f"--objective energy|cost {a.objective_limit:g} s each."), ""]
    for model, cluster, gbs, losses in INSTANCES:
        m, c = load_model(model), load_cluster(cluster)
        tr = TrainingSpec(global_batch_size=gbs, seq_len=4096)
        opts = SolveOptions(time_limit_s=a.limit, threads=2, **(SOLVE_SPACE if a.cli_defaults else {}))
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
        lines += ["", _energy_line(ctx, book, a.objective_limit), "", _cost_line(ctx, book, a.objective_limit), "",
                  f"replan after losing one node, `--time-limit {replan.DEFAULT_TIME_LIMIT_S:g}` (the CLI default):", "",
                  "| cluster now | wall s | status | proven gap | new T s | degraded T s | migration | choice |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [_replan_line(base, m, tr, opts, lost, book) for lost in losses]
        lines.append("")
        print("\n".join(lines[-20:]), flush=True)
    lines.append(f"load average at the end {os.getloadavg()[0]:.1f}")
    a.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
