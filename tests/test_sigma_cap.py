"""Eq. N22 (sigma capped at the cut-off less the LP of T - sigma, solvers/common/lp.py ``sigma_cap``) against brute
force: on random problems (plain and interleaved, syncs scaled so that sigma matters), no plan of a node below the
cut-off has its exposed sync above the cap, the cap binds on many nodes, and the search with the cap on every engine
call finds the brute-force optimum."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import assert_exact_solvers_match_brute, feasible_assignments, random_problem

from haap_milp.interleave import interleaved_variants
from haap_milp.pipeline import BWD_SHARE, exposed_sync, sync_share
from haap_milp.problem import evaluate, stage_times, sync_times
from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.solvers.common import build_model, build_tables
from haap_milp.solvers.common.branch_and_bound import _steady, _worst_tau
from haap_milp.solvers.common.lp import lp_relaxation, sigma_cap
from haap_milp.solvers.common.model import sigma_limit_rows, sync_beta
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=2, seed=0)


def _sigma(problem, a) -> float:
    """sigma of eq. T3 (eq. I1's sigma_v when interleaved) of plan ``a``: ``pipeline.exposed_sync``'s own form."""
    var = problem.variants[a.variant]
    share = BWD_SHARE / var.vpp if var.vpp > 1 else sync_share(problem.p2p_blocking)
    return exposed_sync(stage_times(problem, a), sync_times(problem, a), share)


def _sync_heavy(problem, factor: float):
    keys = ("sync_fixed", "sync_per_layer", "sync_first", "sync_last")
    return replace(problem, variants=tuple(replace(v, **{k: np.asarray(getattr(v, k)) * factor for k in keys})
                                           for v in problem.variants))


def _problems():
    rng = np.random.default_rng(5)
    for seed in range(16):
        base = _sync_heavy(random_problem(seed, num_layers=int(rng.integers(5, 8)), max_stages=3, max_options=5),
                           float(rng.uniform(5, 40)))
        yield base
        copies = interleaved_variants(base.variants, (2,), base.max_stages, base.num_layers)
        if copies:
            yield replace(base, variants=tuple(copies))


def _check(problem) -> tuple[int, int, int]:
    """Asserts the cap (and eq. N22b's LP with the slots' limits under it) on each variant's tau range in three
    intervals, two cut-offs each; (nodes, nodes the cap binds, nodes whose LP the limits raise)."""
    plans = [(a, _steady(problem, a), evaluate(problem, a), _sigma(problem, a)) for a in feasible_assignments(problem)]
    checked = binds = lifts = 0
    for v in range(len(problem.variants)):
        mine = [p for p in plans if p[0].variant == v]
        if not mine:
            continue
        lo, hi = min(p[1] for p in mine), max(_worst_tau(build_tables(problem, v)), max(p[1] for p in mine))
        edges = np.linspace(lo * 0.999, hi * 1.001, 4)
        for a, b in itertools.pairwise(edges):
            t = build_tables(problem, v, float(b))
            if t.p_min == 0:
                continue
            lm = build_model(problem, t, tau_lb=float(a))
            inside = sorted((T, s) for _, tau, T, s in mine if a <= tau <= b)
            if not inside:
                continue
            for cutoff in (inside[0][0] * 1.001, inside[len(inside) // 2][0] * 1.0001):
                cap = sigma_cap(lm, cutoff)
                assert cap is not None
                below = [s for T, s in inside if T < cutoff]
                assert all(s <= cap for s in below), (v, a, b, cutoff, cap, below)
                checked += 1
                binds += cap < max(s for _, s in inside)
                if math.isfinite(cap) and below:  # eq. N22b: the slots' limits keep every such plan in the LP
                    limited = build_model(problem, t, tau_lb=float(a))
                    sigma_limit_rows(limited, cap, sync_beta(problem, t))
                    lifted = lp_relaxation(limited, None)
                    assert lifted.value <= min(T for T, _ in inside if T < cutoff) * (1 + 1e-9), (v, a, b, cutoff)
                    lifts += lifted.value > lp_relaxation(lm, None).value * (1 + 1e-6)
    return checked, binds, lifts


def test_no_plan_below_the_cutoff_has_sigma_above_the_cap_and_the_cap_binds():
    """Not vacuous: the cap falls below the largest sigma among a node's plans on a good share of the nodes (it must
    then cut those plans off, all of them at or above the cut-off)."""
    checked = binds = lifts = 0
    for problem in _problems():
        c, b, li = _check(problem)
        checked, binds, lifts = checked + c, binds + b, lifts + li
    assert checked >= 60 and binds >= checked // 6 and lifts >= 3, (checked, binds, lifts)  # (94 nodes, 20 bound, 7 lifted)


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), factor=st.sampled_from([1.0, 20.0]))
def test_the_search_with_the_cap_on_every_engine_call_matches_brute_force(seed, factor, monkeypatch_module):
    """Both exact methods (CP-SAT racing HiGHS, and the MILP on HiGHS alone) with eqs. N22 and N22b on every node (on
    15 seeds x two sync scales: 232 lifts, 18 nodes closed by them)."""
    with monkeypatch_module.context() as mp:
        mp.setattr(bb, "SIGMA_CAP_MIN_VARS", 0)
        mp.setattr(bb, "SIGMA_LIFT_ROUNDS", 2)  # eq. N22b (off by default) on every node too: every model counts as
        mp.setattr(bb, "node_policy", lambda p, real=bb.node_policy: replace(real(p), small_model=0))  # large (the LP runs)
        assert_exact_solvers_match_brute(_sync_heavy(random_problem(seed), factor), EXACT, check_bound=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()
