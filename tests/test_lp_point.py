"""Eq. N2d (solvers/common/lp_point.py): a child node skips its LP only where that LP cannot lift its bound.

On random problems, each variant's node over a tau range is solved, then split on its stage count as the search
splits it (tables rebuilt on [P_lo, P_hi], so the child's model numbers its variables afresh): wherever ``holds``
says the parent's LP optimum lies in the child's LP at the parent's value, the child's own LP is no higher (the skip
forgoes nothing), and ``holds`` is not vacuous (it says so on some children and not on others). The search with the
skip matches brute force, having skipped LPs."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import all_models_large, random_problem, solve_against_brute

from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.solvers.common import build_model, lp_point
from haap_milp.solvers.common.lp import lp_relaxation
from haap_milp.specs import SolveOptions


def _children(problem, v: int, b: float, plo: int, phi: int):
    """The node's stage-count halves, as the search makes them (``_node_tables`` on each range)."""
    mid = (plo + phi) // 2
    for lo, hi in ((plo, mid), (mid + 1, phi)):
        t = bb._node_tables(problem, v, b, bb.NO_KEEP, lo, hi)
        if t is not None:
            yield t


def _check(seed: int) -> tuple[int, int]:
    """Asserts the skip's promise on the seed's nodes; returns (children where it holds, where it does not)."""
    problem = random_problem(seed, num_layers=8, max_stages=4)
    held = failed = 0
    for v in range(len(problem.variants)):
        t = bb._node_tables(problem, v, None, bb.NO_KEEP, 1, 1 << 30)
        if t is None or t.p_max <= t.p_min:
            continue
        b = bb._worst_tau(t)
        lm = build_model(problem, bb._node_tables(problem, v, b, bb.NO_KEEP, 1, 1 << 30))
        lpr = lp_relaxation(lm)
        if lpr is None or not math.isfinite(lpr.value) or lpr.x is None:
            continue
        point = lp_point.keyed(lm, lpr.x)
        for tc in _children(problem, v, b, lm.t.p_min, lm.t.p_max):
            child = build_model(problem, tc)
            if lp_point.holds(child, point, lpr.value):
                held += 1
                own = lp_relaxation(child)
                assert own is not None and own.value <= lpr.value + 1e-6 * max(1.0, abs(lpr.value)), (seed, v, own)
            else:
                failed += 1
    return held, failed


def test_a_child_skips_its_lp_only_where_it_cannot_lift_the_bound():
    counts = np.array([_check(seed) for seed in range(30)])
    assert counts[:, 0].sum() >= 5 and counts[:, 1].sum() >= 5, counts.sum(axis=0)


def test_a_point_off_the_child_or_above_its_bound_does_not_hold():
    """A variable the child has as the constant 1 (a stage count below its P_lo) at 0.5, and a bound below the
    point's objective, each fail."""
    for seed in range(40):
        problem = random_problem(seed, num_layers=8, max_stages=4)
        for v in range(len(problem.variants)):
            t = bb._node_tables(problem, v, None, bb.NO_KEEP, 1, 1 << 30)
            if t is None or t.p_max <= t.p_min:
                continue
            lm = build_model(problem, t)
            lpr = lp_relaxation(lm)
            if lpr is None or not math.isfinite(lpr.value) or lpr.x is None:
                continue
            point = lp_point.keyed(lm, lpr.x)
            assert lp_point.holds(lm, point, lpr.value)  # its own model, at its own value
            assert not lp_point.holds(lm, point, lpr.value - 1e-3 * max(1.0, abs(lpr.value)))
            k = max(k for k in lm.used) if lm.used else None
            if k is None:
                continue
            tc = bb._node_tables(problem, v, None, bb.NO_KEEP, k, k)
            if tc is None:
                continue
            off = {**point, ("used", k): 0.5}  # the child has used[k] = 1 (k <= its P_lo): not its point
            assert not lp_point.holds(build_model(problem, tc), off, math.inf)
            return
    raise AssertionError("no variant with a stage-count variable")


def test_the_search_with_skipped_lps_matches_brute_force(monkeypatch):
    all_models_large(monkeypatch)
    skipped = 0
    for seed in range(16):
        problem = random_problem(seed, num_layers=8, max_stages=4)
        res = solve_against_brute(problem, "cpsat", SolveOptions(time_limit_s=20, threads=1), tag=seed)
        skipped += 0 if res is None else res.stats.get("lp_inherited", 0)
    assert skipped >= 1


def test_the_unscaled_node_lp_gives_the_scaled_lps_status_and_value(monkeypatch):
    """Eq. N24: from PRESOLVE_MIN_COLS columns the node LP runs without HiGHS' scaling (``lp.UNSCALED``); with the
    gate at 0 (every LP) its status and value are the scaled LP's (within HiGHS' 1e-7 tolerances: measured 4.3e-8
    of max(1, |value|) at most here; 1.1e-14 relative on 311 node LPs of nine grid rows), with and without the cut-off
    row."""
    from haap_milp.solvers.common import lp as lp_mod

    checked, worst = 0, 0.0
    for seed in range(30):
        problem = random_problem(seed, num_layers=8, max_stages=4)
        for v in range(len(problem.variants)):
            t = bb._node_tables(problem, v, None, bb.NO_KEEP, 1, 1 << 30)
            if t is None:
                continue
            lm = build_model(problem, t)
            monkeypatch.setattr(lp_mod, "PRESOLVE_MIN_COLS", 0)
            value = lp_relaxation(lm).value
            for cutoff in (None, 1.5 * (value or 1.0)):
                got = []
                for unscaled in (False, True):
                    monkeypatch.setattr(lp_mod, "UNSCALED", unscaled)
                    lpr = lp_relaxation(lm, cutoff)
                    got.append(None if lpr is None else lpr.value)
                assert (got[0] is None) == (got[1] is None), (seed, v, got)
                if got[0] is not None and math.isinf(got[0]):  # (infeasible: both)
                    assert got[1] == got[0], (seed, v, got)
                elif got[0] is not None:
                    assert abs(got[0] - got[1]) <= 1e-6 * max(1.0, abs(got[0])), (seed, v, got)  # (HiGHS: 1e-7 tolerances)
                    worst = max(worst, abs(got[0] - got[1]) / max(1.0, abs(got[0])))
                    checked += 1
    assert checked >= 20, (checked, worst)
