"""Regenerate the example plots shown in the README (docs/img/example_timeline.*, example_memory.*).

Run: ``.venv/bin/python benchmarks/example_plots.py [--solver dp]``. Plans the default problem
(``haap-solve solve`` with no arguments), replays the plan and draws both plots.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from haap_milp import planner
from haap_milp.catalog import DEFAULT_CLUSTER, DEFAULT_MODEL, load_cluster, load_model
from haap_milp.report.plots import memory_bars, plot_memory, plot_timeline
from haap_milp.simulate import simulate_plan
from haap_milp.specs import SolveOptions, TrainingSpec


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--solver", default="dp")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "img")
    args = ap.parse_args(argv)
    model, cluster, training = load_model(DEFAULT_MODEL), load_cluster(DEFAULT_CLUSTER), TrainingSpec()
    out = planner.solve(model, cluster, training, SolveOptions(solver=args.solver, time_limit_s=30))
    plan = out.result.plan
    if plan is None:
        sys.stderr.write(f"no plan: {out.result.status.value} {out.result.message}\n")
        return 1
    est = out.estimator
    estimate = est.estimate(plan)
    sim = simulate_plan(plan, est)
    paths = plot_timeline(sim, args.out / "example_timeline",
                          title=f"{DEFAULT_MODEL} on {DEFAULT_CLUSTER} ({args.solver})")
    paths += plot_memory(memory_bars(plan, estimate, cluster), args.out / "example_memory",
                         title=f"{DEFAULT_MODEL} on {DEFAULT_CLUSTER}: peak memory per GPU")
    sys.stdout.write("\n".join(map(str, paths)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
