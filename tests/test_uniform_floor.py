"""The uniform baseline's floor prune (solvers/uniform.py, USE_FLOOR): a placement whose eq. T1 floor
(L/P) ((M - 1) max_j layer_time + sum_j layer_time) reaches the best plan so far is skipped unchecked, and a stage count
whose least floor over its placements does (USE_COUNT_FLOOR) is skipped whole. Neither may change the result: the same
plan time with and without them on random problems, the floor at or below every placement's own T, and the least
floor at or below every placement's floor."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem

from haap_milp.problem import Assignment, Stage, evaluate
from haap_milp.solvers import uniform


@pytest.mark.parametrize("by_count", [False, True])
def test_floor_prune_keeps_the_result(monkeypatch, by_count):
    skipped = compared = 0
    for seed in range(40):
        problem = random_problem(seed, num_layers=8 + seed % 5, max_stages=4 + seed % 3)
        monkeypatch.setattr(uniform, "USE_FLOOR", True)
        monkeypatch.setattr(uniform, "USE_COUNT_FLOOR", by_count)
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


def _sigs(problem, var):
    """The baseline's option per (signature, group) of a variant (as ``uniform.solve`` groups them)."""
    import numpy as np

    by_sig: dict = {}
    for i in np.flatnonzero(var.allowed):
        o = problem.options[i]
        if not o.mix:
            by_sig.setdefault((o.tp, o.dp, o.recompute, o.ep, o.zero, o.etp), {}).setdefault(o.group, int(i))
    return by_sig.values()


def test_floors_are_below_every_uniform_plan():
    """The placement floor at or below the plan's T, and the stage count's least floor at or below every placement's
    floor, on every placement the baseline enumerates (random problems without EX1 terms)."""
    import numpy as np

    checked = counted = 0
    for seed in range(20):
        problem = random_problem(seed, num_layers=8 + seed % 5, max_stages=4)
        L = problem.num_layers
        for vi, var in enumerate(problem.variants):
            if var.vpp > 1 or var.extra is not None:
                continue
            lt, M = np.asarray(var.layer_time, float), var.num_microbatches
            for sig_opts in _sigs(problem, var):
                gpus = problem.options[next(iter(sig_opts.values()))].num_gpus
                for p in range(1, min(problem.max_stages, L) + 1):
                    if L % p:
                        continue
                    least = uniform._least_floor(lt, sig_opts, uniform._holds(problem, sig_opts, gpus), p, M)
                    for chosen in uniform._placements(problem, sig_opts, p, gpus):
                        floor = (M - 1) * max(lt[o] for o in chosen) + sum(lt[o] for o in chosen)
                        a = Assignment(vi, tuple(Stage(o, L // p) for o in chosen))
                        if np.isfinite(floor):
                            assert (L // p) * floor <= evaluate(problem, a) * (1 + 1e-12), (seed, vi, chosen)
                            checked += 1
                        assert least <= floor * (1 + 1e-12), (seed, vi, p, chosen)
                        counted += 1
    assert checked > 100 and counted > 100, (checked, counted)


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


def test_the_plan_is_the_fastest_feasible_placement_even_where_faster_ones_break_a_limit(monkeypatch):
    """The baseline prices a placement before it checks it (only a plan that beats the best is checked): its plan is
    still the least T among the feasible placements (brute force over every signature, stage count and placement),
    also where an infeasible placement is faster (memory halved: some placements overflow)."""
    from dataclasses import replace

    import numpy as np

    from haap_milp.problem import violations

    monkeypatch.setattr(uniform, "USE_FLOOR", False)
    monkeypatch.setattr(uniform, "USE_COUNT_FLOOR", False)
    checked = faster_infeasible = 0
    for seed in range(40):
        problem = random_problem(seed, num_layers=8 + seed % 5, max_stages=4 + seed % 3)
        problem = replace(problem, variants=tuple(replace(v, mem_capacity=np.asarray(v.mem_capacity) * 0.5)
                                                  for v in problem.variants)) if seed % 2 else problem
        L, best, least_any = problem.num_layers, float("inf"), float("inf")
        for vi, var in enumerate(problem.variants):
            if var.vpp > 1:
                continue
            by_sig: dict = {}
            for i in np.flatnonzero(var.allowed):
                o = problem.options[i]
                if not o.mix:
                    by_sig.setdefault((o.tp, o.dp, o.recompute, o.ep, o.zero, o.etp), {}).setdefault(o.group, int(i))
            for sig_opts in by_sig.values():
                gpus = problem.options[next(iter(sig_opts.values()))].num_gpus
                for p in (p for p in range(1, min(problem.max_stages, L) + 1) if L % p == 0):
                    for chosen in uniform._placements(problem, sig_opts, p, gpus):
                        a = Assignment(vi, tuple(Stage(o, L // p) for o in chosen))
                        t = evaluate(problem, a)
                        least_any = min(least_any, t)
                        if not violations(problem, a):
                            best = min(best, t)
        got = uniform.solve(problem)
        if got.assignment is None:
            assert best == float("inf"), seed
            continue
        assert not violations(problem, got.assignment)
        assert got.objective_s == pytest.approx(best, rel=1e-12), seed
        checked += 1
        faster_infeasible += least_any < best * (1 - 1e-9)
    assert checked >= 15 and faster_infeasible >= 2, (checked, faster_infeasible)


def _one_signature(problem):
    """The problem with each variant's options cut to the (tp, dp, recompute) signature held by the most groups."""
    import collections
    import dataclasses

    sigs = collections.Counter((o.tp, o.dp, o.recompute) for o in problem.options)
    sig = max(sigs, key=lambda k: (len({o.group for o in problem.options if (o.tp, o.dp, o.recompute) == k}), k))
    mask = np.array([(o.tp, o.dp, o.recompute) == sig for o in problem.options])
    return dataclasses.replace(problem, variants=tuple(dataclasses.replace(v, allowed=v.allowed & mask)
                                                       for v in problem.variants[:1]))


def test_the_walk_stops_inside_a_signature_past_its_deadline(monkeypatch):
    """Past its deadline the walk stops within CHECK_EVERY placements of one stage count (not only between
    signatures: one signature on 16 groups has millions of orders), with its plan so far; without a plan it goes on
    UNPLANNED_GRACE_S, then ends with NO_SOLUTION. One variant of one signature, so the clock between signatures
    never looks: fails if it is looked at only there."""
    from haap_milp.deadline import Deadline, use

    monkeypatch.setattr(uniform, "USE_FLOOR", False)
    problem = _one_signature(random_problem(9, num_groups=6, num_layers=12, max_stages=12))
    whole = uniform.solve(problem)
    assert whole.status == "FEASIBLE" and whole.stats["tried"] >= 20, whole.stats
    monkeypatch.setattr(uniform, "CHECK_EVERY", 1)
    with use(Deadline(0.0)):
        first = uniform.solve(problem)  # (expired at once: the walk stops at the first plan found)
    assert first.status == "FEASIBLE" and first.stats["tried"] < whole.stats["tried"] / 2, first.stats
    monkeypatch.setattr(uniform, "UNPLANNED_GRACE_S", -1.0)
    with use(Deadline(0.0)):
        none = uniform.solve(problem)
    assert none.status == "NO_SOLUTION" and none.stats["tried"] == 0, none
