"""Eq. LS4 (solvers/common/segment_dp.py): the segment DP returns a feasible plan, and it is the least of eq. N4's
right side over every plan of the node whose groups form contiguous segments (brute force on small instances)."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys

import numpy as np

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
    groups = [problem.options[s.option].group for s in plan.stages]
    seen, last = set(), None
    for g in groups:
        if g != last and g in seen:
            return False
        seen.add(g)
        last = g
    return True


def _plans(problem, v: int, P_max: int):
    L = problem.num_layers
    opts = np.flatnonzero(problem.variants[v].allowed).tolist()
    for P in range(1, P_max + 1):
        for cuts in itertools.combinations(range(1, L), P - 1):
            sizes = np.diff([0, *cuts, L]).tolist()
            for combo in itertools.product(opts, repeat=P):
                yield Assignment(v, tuple(Stage(int(o), int(n)) for o, n in zip(combo, sizes)))


def test_segment_dp_is_feasible_and_least_over_segment_plans():
    checked = found = 0
    for seed in range(40):
        problem = random_problem(seed, uniform=False, same_tp_first_last=False)
        for v, dp, _ in variant_nodes(problem):
            t = dp.t
            if not segment_dp.applies(dp):
                continue
            plan = segment_dp.segment_plan(dp)
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
