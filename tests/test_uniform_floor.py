"""The uniform baseline's floor prune (solvers/uniform.py, USE_FLOOR): a placement whose eq. T1 floor
M (L/P) max_j layer_time reaches the best plan so far is skipped unchecked. It must not change the result: the same
plan time with and without it on random problems, and the floor at or below every placement's own T."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem

from haap_milp.problem import Assignment, Stage, evaluate
from haap_milp.solvers import uniform


def test_floor_prune_keeps_the_result(monkeypatch):
    skipped = compared = 0
    for seed in range(40):
        problem = random_problem(seed, num_layers=8 + seed % 5, max_stages=4 + seed % 3)
        monkeypatch.setattr(uniform, "USE_FLOOR", True)
        on = uniform.solve(problem)
        monkeypatch.setattr(uniform, "USE_FLOOR", False)
        off = uniform.solve(problem)
        assert on.status == off.status, seed
        if off.status != "FEASIBLE":
            continue
        compared += 1
        assert on.objective_s == pytest.approx(off.objective_s, rel=1e-12), seed
        skipped += on.stats["skipped_by_floor"]
    assert compared >= 20 and skipped > 0, (compared, skipped)


def test_floor_is_below_every_uniform_plan():
    """The bound itself, on every placement the baseline enumerates (without EX1 terms)."""
    checked = 0
    for seed in range(20):
        problem = random_problem(seed, num_layers=8, max_stages=4)
        L = problem.num_layers
        for vi, var in enumerate(problem.variants):
            if var.vpp > 1 or var.extra is not None:
                continue
            for i in range(len(problem.options)):
                for p in (1, 2, 4):
                    a = Assignment(vi, tuple(Stage(i, L // p) for _ in range(p)))
                    floor = var.num_microbatches * (L // p) * float(var.layer_time[i])
                    if floor < float("inf"):
                        assert floor <= evaluate(problem, a) * (1 + 1e-12), (seed, vi, i, p)
                        checked += 1
    assert checked > 100, checked
