"""Write the pinned Problem-level reference instances (``*.json`` next to this file).

Each instance is a small ``haap_milp.problem.Problem`` with every cost array written out, plus its
brute-force optimum. Nothing depends on the estimator or calibration.json: the optimum moves only if
the semantics of ``problem.evaluate``/``violations`` change (then review the diff). The arrays were
drawn once from tests/synthetic.py (seed and arguments recorded under ``provenance``) and then frozen;
regenerating rewrites them from the current synthetic.py, so only do it on purpose:

    python formulations/instances/problems/generate.py

Tests: tests/test_pinned_instances.py.
"""

from __future__ import annotations

import json
import pathlib
import sys
from dataclasses import replace

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent.parent / "tests"))

from problem_io import assignment_to_dict, even_split_uniform_optimum, problem_to_dict
from synthetic import random_problem

from haap_milp.solvers import get_solver

CASES = {
    "t2-round-trip": {
        "args": {"seed": 1, "max_stages": 4, "num_layers": 6},
        "description": "Slow links and many micro-batches: at the optimum a window term of eq. T2 (two stages and "
                    "their link, a 1F1B cycle) sets the period (above the slowest stage and half the slowest link)."},
    "t3-sync": {
        "args": {"seed": 13},
        "description": "Large DP sync: eq. T3's exposed sync changes the optimum (with sync set to zero brute "
                    "force picks a different plan)."},
    "memory-bound": {
        "args": {"seed": 0, "max_stages": 4, "num_layers": 6},
        "description": "Tight memory: a stage of the optimum is over 90% full, and with 100x the memory the "
                    "optimum is over 5% faster."},
    "uniform-target": {
        "args": {"seed": 14, "max_stages": 4, "num_layers": 6},
        "description": "uniform=True (eq. U1): the optimum has one (tp, dp, recompute) signature; without the rule "
                    "brute force finds a faster plan."},
    "infeasible-memory": {
        "args": {"seed": 0, "max_stages": 4, "num_layers": 6}, "max_stages": 1, "mem_scale": 0.6,
        "description": "memory-bound instance with 60% of the memory, limited to one stage: no option holds "
                    "all 6 layers, so no plan exists (with 100x the memory one does)."},
}


def build(case: dict):
    a = dict(case["args"])
    p = random_problem(a.pop("seed"), **a)
    if "max_stages" in case:
        p = replace(p, max_stages=case["max_stages"])
    if "mem_scale" in case:  # shrink memory; an option that cannot hold one layer is no longer allowed
        p = replace(p, variants=tuple(replace(
            v, mem_capacity=v.mem_capacity * case["mem_scale"],
            allowed=v.allowed & (v.fixed_mem + v.layer_static_mem + v.layer_act_mem <= v.mem_capacity * case["mem_scale"]))
            for v in p.variants))
    return p


def main() -> None:
    brute = get_solver("brute")
    for name, case in CASES.items():
        p = build(case)
        r = brute(p)
        doc = {"name": name, "description": case["description"],
               "provenance": {"generator": "tests/synthetic.py random_problem", **case["args"],
                              **{f"{k}_override": case[k] for k in ("max_stages", "mem_scale") if k in case}},
               "optimum": {"status": r.status, "objective_s": r.objective_s,
                           "assignment": assignment_to_dict(r.assignment)},
               "even_split_uniform_optimum_s": even_split_uniform_optimum(replace(p, uniform=True)),
               "problem": problem_to_dict(p)}
        (HERE / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(name, r.status, r.objective_s, doc["even_split_uniform_optimum_s"])


if __name__ == "__main__":
    main()
