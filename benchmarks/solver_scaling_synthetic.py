"""Solver scaling on synthetic instances (tests/synthetic.py), not a test.

Times the DP heuristic and the exact solvers (warm-started from the DP plan, as the planner does) on
growing synthetic problems and prints a Markdown table; ``--out FILE`` also writes it.

    .venv/bin/python benchmarks/solver_scaling_synthetic.py                 # default grid, 10 s limit
    .venv/bin/python benchmarks/solver_scaling_synthetic.py --quick         # two small sizes
    .venv/bin/python benchmarks/solver_scaling_synthetic.py --gpus 1024 --types 3 --layers 80 --seeds 3
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from synthetic import count_options, large_problem

from haap_milp.solvers import get_solver
from haap_milp.specs import SolveOptions

HEADER = ("| GPUs | types | layers | seed | options/variant | DP s | DP obj | "
          + " | ".join(f"{m} status | {m} obj | {m} gap | {m} s" for m in ("cpsat", "milp")) + " |")


def _gap(res) -> str:
    if res.objective_s is None or res.bound_s is None:
        return "-"
    return f"{max(0.0, (res.objective_s - res.bound_s) / res.objective_s):.2%}"


def run_one(gpus: int, types: int, layers: int, seed: int, limit_s: float, threads: int,
            methods: tuple[str, ...]) -> str:
    problem = large_problem(seed, num_gpus=gpus, num_types=types, num_layers=layers)
    opts = SolveOptions(time_limit_s=limit_s, threads=threads, relative_gap=0.01)
    t0 = time.perf_counter()
    dp = get_solver("dp")(problem, opts)
    dp_s = time.perf_counter() - t0
    cells = [str(gpus), str(types), str(layers), str(seed), "/".join(map(str, count_options(problem))),
             f"{dp_s:.2f}", f"{dp.objective_s:.3f}" if dp.objective_s else dp.status]
    for m in ("cpsat", "milp"):
        if m not in methods:
            cells += ["-"] * 4
            continue
        t0 = time.perf_counter()
        res = get_solver(m)(problem, opts, hint=dp.assignment)
        wall = time.perf_counter() - t0
        obj = f"{res.objective_s:.3f}" if res.objective_s is not None else "-"
        cells += [res.status, obj, _gap(res), f"{wall:.1f}"]
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="*", default=[64, 256, 1024])
    ap.add_argument("--types", type=int, nargs="*", default=[2, 3])
    ap.add_argument("--layers", type=int, nargs="*", default=[40, 80])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--methods", default="cpsat,milp")
    ap.add_argument("--quick", action="store_true", help="64 and 256 GPUs, 2 types, 40 layers, 5 s")
    ap.add_argument("--out", type=pathlib.Path, help="also write the table here (Markdown)")
    a = ap.parse_args(argv)
    if a.quick:
        a.gpus, a.types, a.layers, a.time_limit = [64, 256], [2], [40], 5.0
    methods = tuple(a.methods.split(","))
    title = (f"Synthetic scaling, time limit {a.time_limit:g} s, {a.threads} threads, gap target 1 %, "
             "exact solvers warm-started from DP")
    lines = [title, "", HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    print("\n".join(lines), flush=True)
    for gpus in a.gpus:
        for types in a.types:
            for layers in a.layers:
                for seed in range(a.seeds):
                    row = run_one(gpus, types, layers, seed, a.time_limit, a.threads, methods)
                    lines.append(row)
                    print(row, flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
