"""Eq. LS4 (solvers/common/segment_dp.py): the segment DP returns a feasible plan, and it is the least of eq. N4's
right side over every plan of the node whose groups form contiguous segments (brute force on small instances)."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem, variant_nodes

from haap_milp.problem import Assignment, Stage, violations
from haap_milp.solvers.common import segment_dp
from haap_milp.solvers.common.stage_dp import PathDP


def _surrogate(dp: PathDP, plan: Assignment) -> float:
    """sum of the node's stage costs at their slots (inf where the tables forbid the stage) plus the links."""
    local = {int(o): i for i, o in enumerate(dp.t.opts)}
    P = len(plan.stages)
    total, prev = 0.0, None
    for j, st in enumerate(plan.stages):  # pipeline order: slot P - j
        i = local.get(st.option)
        if i is None:
            return math.inf
        k = P - j
        total += float(dp._base(k, j == 0)[i, st.num_layers])
        e = int(dp.t.group[i])
        if prev is not None:
            total += float(dp.link[prev, e])
        prev = e
    return total


def _is_segments(problem, plan: Assignment) -> bool:
    """Each group one run of stages, and each island one run of groups."""
    island = problem.group_island
    for of in (lambda g: g, lambda g: int(island[g])):
        seen, last = set(), None
        for x in (of(problem.options[s.option].group) for s in plan.stages):
            if x != last and x in seen:
                return False
            seen.add(x)
            last = x
    return True


def _plans(problem, v: int, P_max: int):
    L = problem.num_layers
    opts = np.flatnonzero(problem.variants[v].allowed).tolist()
    for P in range(1, P_max + 1):
        for cuts in itertools.combinations(range(1, L), P - 1):
            sizes = np.diff([0, *cuts, L]).tolist()
            for combo in itertools.product(opts, repeat=P):
                yield Assignment(v, tuple(Stage(int(o), int(n)) for o, n in zip(combo, sizes)))


def _shared_islands(problem):
    """The same problem with its groups on two islands, two or more groups each (names ``type#n@isl{n % 2}``), and
    every link between groups as cheap as the cheapest, so that leaving an island and coming back can pay (the
    island runs are then a real restriction)."""
    from dataclasses import replace

    names = tuple(f"{g.split('@')[0]}#{n}@isl{n % 2}" for n, g in enumerate(problem.groups))
    variants = tuple(replace(v, p2p_time=np.full_like(np.asarray(v.p2p_time), float(np.min(v.p2p_time))))
                     for v in problem.variants)
    return replace(problem, groups=names, variants=variants)


@pytest.mark.parametrize("islands", ["own", "shared"])
def test_segment_dp_is_feasible_and_least_over_segment_plans(islands):
    """``own``: every group its own island (random_problem's names), so any order of group segments; ``shared``:
    four groups on two islands, so the island runs (``segment_dp._step``) bind."""
    checked = found = 0
    for seed in range(40):
        problem = random_problem(seed, uniform=False, same_tp_first_last=False,
                                 num_groups=None if islands == "own" else 4)
        if islands == "shared":
            problem = _shared_islands(problem)
        for v, dp, _ in variant_nodes(problem):
            t = dp.t
            if not segment_dp.applies(dp, problem.group_island):
                continue
            plan = segment_dp.segment_plan(dp, problem.group_island)
            best = math.inf
            for a in _plans(problem, v, min(t.p_max, problem.max_stages)):
                if len(a.stages) < t.p_min or not _is_segments(problem, a) or violations(problem, a):
                    continue
                best = min(best, _surrogate(dp, a))
            checked += 1
            if plan is None:
                assert math.isinf(best), (seed, v, best)
                continue
            found += 1
            assert violations(problem, plan) == [], (seed, v, plan)
            assert _is_segments(problem, plan)
            assert math.isclose(_surrogate(dp, plan), best, rel_tol=1e-9), (seed, v, _surrogate(dp, plan), best)
    assert checked >= 20 and found >= 10, (checked, found)
