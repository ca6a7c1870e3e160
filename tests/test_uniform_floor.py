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


def _placements_by_permutation(capacity, sig_opts, p, gpus):
    """The baseline's placements as first written: every order of the groups, each list at its first order."""
    import itertools

    groups = sorted(sig_opts)
    seen = set()
    for order in itertools.permutations(groups):
        left = {g: capacity[g] for g in groups}
        chosen, gi = [], 0
        for _ in range(p):
            while gi < len(order) and left[order[gi]] < gpus:
                gi += 1
            if gi == len(order):
                break
            left[order[gi]] -= gpus
            chosen.append(sig_opts[order[gi]])
        if len(chosen) == p and tuple(chosen) not in seen:
            seen.add(tuple(chosen))
            yield chosen


def test_placements_by_prefix_are_the_permutations_in_the_same_order():
    """The prefix walk yields exactly the permutation version's lists, in the same order (so ties keep the same plan)."""
    import types

    import numpy as np

    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        n = int(rng.integers(1, 7))
        groups = sorted(int(g) for g in rng.choice(10, size=n, replace=False))
        capacity = {g: int(rng.integers(0, 9)) for g in groups}
        sig_opts = {g: 100 + g for g in groups}
        gpus, p = int(rng.integers(1, 4)), int(rng.integers(1, 7))
        problem = types.SimpleNamespace(group_capacity=capacity)
        got = list(uniform._placements(problem, sig_opts, p, gpus))
        want = list(_placements_by_permutation(capacity, sig_opts, p, gpus))
        assert got == want, (capacity, gpus, p)
        checked += bool(want)
    assert checked > 100, checked
