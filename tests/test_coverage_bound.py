"""Eq. B2's coverage (bounds.coverage_at): a mixed option's layers split over its groups by GPU share (eq. B2b), and
each stage of a multi-stage pipeline carrying its least blocking sends (eq. B2c). Both are checked to stay below
brute force's optimum, and by hand on instances where the value is known."""

from __future__ import annotations

import math
import pathlib
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import any_interleaved_copies, random_problem, with_blocking_sends

from haap_milp import pipeline
from haap_milp.problem import Option, Problem, Replicas, Variant, boundary_times, stage_times
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import bounds
from haap_milp.solvers.common.bounds import coverage_at, variant_bound
from haap_milp.solvers.common.slot_bounds import build_tables, send_floor


def _variant(n_opts: int, layer_time, p2p, **over) -> Variant:
    """Every cost 0 but the layer times and p2p given; memory never binds unless ``over`` sets it."""
    zero = {k: np.zeros(n_opts) for k in ("first_time", "last_time", "layer_static_mem", "layer_act_mem",
                                         "first_static_mem", "first_act_mem", "last_static_mem", "last_act_mem",
                                         "fixed_mem", "sync_fixed", "sync_per_layer", "sync_first", "sync_last")}
    zero["mem_capacity"] = np.full(n_opts, 1e15)
    zero.update(over)
    return Variant(samples_per_microbatch=4, num_microbatches=8, layer_time=np.asarray(layer_time, float),
                   p2p_time=np.asarray(p2p, float), allowed=np.ones(n_opts, bool), **zero)


def test_mixed_option_counts_its_layers_once_across_its_groups(monkeypatch):
    """One mixed option of 1 GPU of group a + 3 of group b (capacities 4 and 3), 1 s a layer, 4 layers: only one
    such stage fits, so the optimum is one stage of 4 layers, tau = 4. Split by GPU share a stage of h layers is
    worth h/4 in a's knapsack (4 fit) and 3h/4 in b's (1 fits): 1.75 h in all; split by the share of each group's
    capacity it takes (1/4 and 3/3: weights 0.2 and 0.8), 4 x 0.2 h + 0.8 h = 1.6 h. The lesser counts, so tau >= 3
    (h = 3 covers 4 layers). Counting the stage whole in both groups gave 5 h, tau >= 1. Eq. B2g (checked last)
    counts the one stage that fits: h, so tau >= 4, the optimum's."""
    mixed = Option(group=0, tp=1, dp=4, ep=1, recompute="none", mix=(Replicas(0, 1, 1, 1), Replicas(1, 1, 3, 1)),
                   link=2)
    prob = Problem(num_layers=4, max_stages=4, groups=("a", "b"), group_capacity=(4, 3), options=(mixed,),
                   variants=(_variant(1, [1.0], np.zeros((3, 3))),))
    t = build_tables(prob, 0)
    hmax = t.U_mem[: t.p_max].max(axis=0)
    monkeypatch.setattr(bounds, "USE_STAGE_CAP", False)  # eq. B2b alone
    monkeypatch.setattr(bounds, "USE_JOINT_COVER", False)  # (eq. B2h's LP: tests/test_joint_cover.py)
    assert coverage_at(prob, t, 1.0, hmax) == pytest.approx(1.6)
    assert coverage_at(prob, t, 3.0, hmax) == pytest.approx(4.8)
    assert variant_bound(prob, t).tau_lb == pytest.approx(3.0)
    # a third group with no GPU (an emptied pool) changes nothing: its load weight stays finite
    empty = replace(prob, groups=("a", "b", "c"), group_capacity=(4, 3, 0),
                    variants=(_variant(1, [1.0], np.zeros((4, 4))),))
    te = build_tables(empty, 0)
    assert coverage_at(empty, te, 1.0, te.U_mem[: te.p_max].max(axis=0)) == pytest.approx(1.6)
    monkeypatch.setattr(bounds, "USE_STAGE_CAP", True)
    assert coverage_at(prob, t, 3.0, hmax) == pytest.approx(3.0)
    b = variant_bound(prob, t)
    assert b.tau_lb == pytest.approx(4.0)
    brute = get_solver("brute")(prob)
    assert brute.status == "OPTIMAL" and len(brute.assignment.stages) == 1
    assert b.total_s <= brute.objective_s * (1 + 1e-12)


def test_stage_cap_by_hand():
    """Eq. B2g: one option of 1 GPU (1 s a layer) of a group of 8 GPUs, 4 layers, at most 2 stages. The knapsack
    alone takes 8 stages of it, 1 layer each: tau >= 1 s. Two stages hold 2 h: tau >= 2 s, the best plan's (2 + 2)."""
    opts = (Option(0, 1, 1, 1, "none"),)
    prob = Problem(num_layers=4, max_stages=2, groups=("a",), group_capacity=(8,), options=opts,
                   variants=(_variant(1, [1.0], np.zeros((1, 1))),))
    t = build_tables(prob, 0)
    b = variant_bound(prob, t)
    assert b.tau_lb == pytest.approx(2.0)
    brute = get_solver("brute")(prob)
    assert brute.status == "OPTIMAL" and max(stage_times(prob, brute.assignment)) == pytest.approx(2.0)


@pytest.mark.parametrize("seed", range(16))
def test_stage_cap_is_below_every_plan(seed):
    """Eq. B2 with eq. B2g on plain variants of one to three stages and on interleaved copies (a fixed stage count)
    never exceeds the best plan of the variant, nor its tau the best plan's slowest stage (brute force per variant)."""
    problem = random_problem(seed, num_layers=int(seed % 4) + 4, max_stages=int(seed % 3) + 1, max_options=6)
    copies = any_interleaved_copies(problem.variants, (2,), 5, problem.num_layers) if seed % 2 else []
    problem = replace(problem, variants=problem.variants + tuple(copies), max_stages=max(problem.max_stages,
                                                                                          5 if copies else 0))
    _below_brute_per_variant(problem, seed, tau=True)


def test_stage_cap_binds(monkeypatch):
    """Not vacuous: on random few-stage problems eq. B2g raises some variants' tau bound (over eq. B2 without eq.
    B2h's LP, which counts the stages too)."""
    monkeypatch.setattr(bounds, "USE_JOINT_COVER", False)
    problems = (random_problem(seed, num_layers=8, max_stages=2, max_options=6) for seed in range(30))
    raised, seen = tau_raised(problems, monkeypatch, "USE_STAGE_CAP")
    assert raised >= 10, (raised, seen)


def test_blocking_sends_raise_tau_when_one_stage_cannot_hold_the_model():
    """Two groups of one GPU each, 1 s a layer, 4 layers, at most 2 layers a stage (memory): every plan has two
    stages or more, and under blocking sends (eq. T2b) each carries at least 0.5 s of sends (an end stage its one
    boundary's round trip, a middle one half of each of its two). tau >= 2 + 0.5, the optimum's own; without
    blocking sends the bound is tau >= 2."""
    opts = (Option(0, 1, 1, 1, "none"), Option(1, 1, 1, 1, "none"))
    var = _variant(2, [1.0, 1.0], np.full((2, 2), 0.5), layer_static_mem=np.ones(2), mem_capacity=np.full(2, 2.0))
    prob = Problem(num_layers=4, max_stages=4, groups=("a", "b"), group_capacity=(1, 1), options=opts,
                   variants=(var,), p2p_blocking=True)
    t = build_tables(prob, 0)
    assert t.p_min == 2
    assert send_floor(prob, t).tolist() == [0.5, 0.5]
    assert variant_bound(prob, t).tau_lb == pytest.approx(2.5)
    assert variant_bound(replace(prob, p2p_blocking=False), build_tables(replace(prob, p2p_blocking=False), 0)
                         ).tau_lb == pytest.approx(2.0)
    brute = get_solver("brute")(prob)
    a = brute.assignment
    tau = pipeline.steady_period(stage_times(prob, a), boundary_times(prob, a), 8, blocking=True)
    assert tau == pytest.approx(2.5)  # two stages of 2 layers, each an end stage paying its boundary (0.5 s): tight
    assert variant_bound(prob, t).total_s <= brute.objective_s * (1 + 1e-12)


def test_one_stage_plan_pays_no_send():
    """When one stage can hold the model, a one-stage plan has no boundary: the bound must not add sends."""
    opts = (Option(0, 1, 1, 1, "none"),)
    prob = Problem(num_layers=3, max_stages=3, groups=("a",), group_capacity=(3,), options=opts,
                   variants=(_variant(1, [1.0], np.full((1, 1), 5.0)),), p2p_blocking=True)
    t = build_tables(prob, 0)
    b = variant_bound(prob, t)
    brute = get_solver("brute")(prob)
    assert len(brute.assignment.stages) == 1 and b.tau_lb <= 3.0 + 1e-12
    assert b.total_s <= brute.objective_s * (1 + 1e-12)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1.0, 20.0, 200.0]))
def test_blocking_bound_is_below_every_plan(seed, scale):
    """Eq. B2 with eq. B2c never exceeds the best plan of its variant, nor its tau the best plan's own period
    (brute force per variant, sends blocking, p2p scaled so that eq. T2b binds in some plans)."""
    problem = with_blocking_sends(random_problem(seed, num_layers=int(seed % 3) + 4, max_stages=4, max_options=5), scale)
    for v in range(len(problem.variants)):
        sub = replace(problem, variants=(problem.variants[v],))
        brute = get_solver("brute")(sub)
        b = variant_bound(sub, build_tables(sub, 0))
        if brute.status != "OPTIMAL":
            assert not math.isfinite(b.total_s) or brute.status == "INFEASIBLE"
            continue
        a = brute.assignment
        tau = pipeline.steady_period(stage_times(sub, a), boundary_times(sub, a), sub.variants[0].num_microbatches,
                                     blocking=True)
        assert b.total_s <= brute.objective_s * (1 + 1e-9)
        assert b.tau_lb <= tau * (1 + 1e-9)


def test_end_stages_keep_tau_below_every_plan():
    """Eq. B2l (the end stages' head and embedding time and memory, and a one-stage plan's, in the coverage): on random plain
    variants, their interleaved copies and blocking-send copies, each variant's tau bound is at most the period of
    every plan of the variant (brute force over all plans, not only the best one), and its bound at most the best
    plan's T; it raises the tau bound over eq. B2 without it on some of them (not vacuous)."""
    from synthetic import feasible_plans

    from haap_milp.problem import evaluate
    from haap_milp.solvers.common.branch_and_bound import _steady

    checked = raised = 0
    for seed in range(20):
        base = random_problem(seed, num_layers=int(seed % 3) + 4, max_stages=4, max_options=5)
        for problem in (base, with_blocking_sends(base, 20.0)):
            copies = any_interleaved_copies(problem.variants, (2,), 4, problem.num_layers) if not problem.p2p_blocking \
                else []
            for var in (*problem.variants, *copies):
                sub = replace(problem, variants=(var,))
                t = build_tables(sub, 0)
                plans = [(_steady(sub, a), evaluate(sub, a)) for a in feasible_plans(sub)]
                b = variant_bound(sub, t)
                if not plans:
                    continue
                checked += 1
                assert b.tau_lb <= min(tau for tau, _ in plans) * (1 + 1e-9), (seed, var.vpp, problem.p2p_blocking)
                assert b.total_s <= min(T for _, T in plans) * (1 + 1e-9)
                bounds.USE_END_STAGES = False
                try:
                    raised += b.tau_lb > variant_bound(sub, build_tables(sub, 0)).tau_lb * (1 + 1e-9)
                finally:
                    bounds.USE_END_STAGES = True
    assert checked >= 100 and raised >= 40, (checked, raised)  # (measured: 109, 55)


def test_bound_binds_on_some_blocking_instances():
    """Not vacuous: on random blocking instances eq. B2c raises some variant's tau bound over the one without it."""
    raised = 0
    for seed in range(30):
        problem = with_blocking_sends(random_problem(seed, num_layers=6, max_stages=4, max_options=5), 20.0)
        for v in range(len(problem.variants)):
            sub = replace(problem, variants=(problem.variants[v],))
            t = build_tables(sub, 0)
            if t.p_min == 0:
                continue
            plain = replace(sub, p2p_blocking=False)
            raised += variant_bound(sub, t).tau_lb > variant_bound(plain, build_tables(plain, 0)).tau_lb * (1 + 1e-6)
    assert raised >= 20, raised  # (60 of the 30 seeds x variants when written)



def test_fixed_stage_count_fill_by_hand():
    """Eq. B2e: one 4-GPU option of group a (0.1 s a layer; group a has 4 GPUs, so one such stage) and a 1-GPU option
    of group b (1 s a layer), 5 layers on exactly 3 stages (an interleaved copy, vpp 2): two stages must be b's, a
    layer each at least, so sum_j t_j >= 3 x 0.1 + 2 x 1 = 2.3 s, where L min lambda gave 0.5 s. That is also the best
    plan's (brute force)."""
    from haap_milp.solvers.common.fill_lp import fixed_count_fill

    opts = (Option(0, 1, 4, 1, "none"), Option(1, 1, 1, 1, "none"))
    var = replace(_variant(2, [0.1, 1.0], np.zeros((2, 2))), num_microbatches=6, vpp=2, num_stages=3)
    prob = Problem(num_layers=5, max_stages=3, groups=("a", "b"), group_capacity=(4, 4), options=opts, variants=(var,))
    t = build_tables(prob, 0)
    assert fixed_count_fill(prob, t) == pytest.approx(2.3, rel=1e-6)
    b = variant_bound(prob, t)
    assert b.rest_lb >= 2.3 / 2 * (1 - 1e-6)  # eq. I1: sum t / vpp
    brute = get_solver("brute")(prob)
    assert brute.status == "OPTIMAL"
    assert sum(stage_times(prob, brute.assignment)) == pytest.approx(2.3)
    assert b.total_s <= brute.objective_s * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_fixed_stage_count_bound_is_below_every_plan(seed):
    """Eq. B2 with eq. B2e on interleaved copies (vpp 2, 3; every stage count of eq. I5) never exceeds the best plan
    of the variant (brute force per variant)."""
    problem = random_problem(seed, num_layers=int(seed % 3) + 5, max_stages=5, max_options=5)
    problem = replace(problem, variants=tuple(any_interleaved_copies(problem.variants, (2, 3), problem.max_stages,
                                                                     problem.num_layers)))
    _below_brute_per_variant(problem, seed)


def _below_brute_per_variant(problem: Problem, seed: int, tau: bool = False) -> None:
    """Each variant's eq. B2 bound is at most brute force's optimum of that variant (infinite only where it has no
    plan); with ``tau``, on a plain variant its tau bound is at most that optimum's slowest stage too."""
    for v in range(len(problem.variants)):
        sub = replace(problem, variants=(problem.variants[v],))
        brute = get_solver("brute")(sub)
        b = variant_bound(sub, build_tables(sub, 0))
        if brute.status == "OPTIMAL":
            assert b.total_s <= brute.objective_s * (1 + 1e-9), (seed, v)
            assert not tau or sub.variants[0].vpp > 1 or b.tau_lb <= max(stage_times(sub, brute.assignment)) * (1 + 1e-9)
        else:
            assert not math.isfinite(b.total_s) or brute.status == "INFEASIBLE"


def test_fixed_stage_count_fill_binds():
    """Not vacuous: on the interleaved copies above eq. B2e's LP exceeds L min lambda on most variants (22 of 30 when
    written)."""
    from haap_milp.solvers.common.fill_lp import fixed_count_fill

    lifted = seen = 0
    for seed in range(12):
        problem = random_problem(seed, num_layers=int(seed % 3) + 5, max_stages=5, max_options=5)
        for var in any_interleaved_copies(problem.variants, (2, 3), problem.max_stages, problem.num_layers):
            sub = replace(problem, variants=(var,))
            t = build_tables(sub, 0)
            if t.p_min == 0 or t.n == 0:
                continue
            seen += 1
            fill = fixed_count_fill(sub, t)
            lifted += fill is not None and fill > t.L * t.coef["layer_time"].min() * (1 + 1e-6)
    assert seen >= 25 and lifted >= 15, (seen, lifted)


def test_knapsack_matches_a_plain_dp():
    """``_knapsack_max`` (vectorised per weight, weights divided by their gcd, real values) against the textbook DP."""
    import random

    from haap_milp.solvers.common.bounds import _knapsack_max

    def plain(w, v, cap):
        f = [0.0] * (cap + 1)
        for c in range(cap + 1):
            for wi, vi in zip(w, v):
                if wi <= c and vi > 0:
                    f[c] = max(f[c], f[c - wi] + vi)
        return f[cap]

    rng = random.Random(0)
    for _ in range(300):
        unit = rng.choice([1, 2, 8])
        w = [unit * rng.randint(1, 6) for _ in range(rng.randint(1, 6))]
        v = [rng.random() * 5 - 0.5 for _ in w]
        cap = rng.randint(0, 60)
        assert _knapsack_max(np.array(w), np.array(v), cap) == pytest.approx(plain(w, v, cap), abs=1e-9)


def tau_raised(problems, monkeypatch, switch: str) -> tuple[int, int]:
    """Over every variant with a plan of ``problems``: (how many have a higher eq. B2 tau bound with
    ``bounds.<switch>`` on than off, how many there are); asserts on >= off on each."""
    raised = seen = 0
    for problem in problems:
        for v in range(len(problem.variants)):
            sub = replace(problem, variants=(problem.variants[v],))
            t = build_tables(sub, 0)
            if t.p_min == 0:
                continue
            seen += 1
            on = variant_bound(sub, t).tau_lb
            monkeypatch.setattr(bounds, switch, False)
            off = variant_bound(sub, t).tau_lb
            monkeypatch.setattr(bounds, switch, True)
            assert on >= off
            raised += on > off * (1 + 1e-6)
    return raised, seen


def _random_variants(seeds):
    """(seed, problem, variant, the problem with that variant alone) over small random problems (brute force can
    enumerate them, up to 5 stages) and their interleaved copies of vpp 2 and 3 (eqs. B2i, B2j's oracles)."""
    for seed in seeds:
        problem = random_problem(seed, num_layers=int(seed % 3) + 5, max_stages=5, max_options=5)
        copies = any_interleaved_copies(problem.variants, (2, 3), problem.max_stages, problem.num_layers)
        for var in [*problem.variants, *copies]:
            yield seed, problem, var, replace(problem, variants=(var,))


def _capped_against_brute(sg, plans: list, switch: str, why) -> tuple[int, int]:
    """The capped rest term of ``sg``'s one variant (``bounds.capped_rest``) at caps from its plans' own periods (the
    least, the median, the largest) against brute force: at most T - (M - 1/vpp) tau of every plan within the cap, and
    never below the term with ``bounds.<switch>`` off. (checked, lifted): the caps with a plan within them, and those
    where the switch lifts the term. ``why``: put in the assertion's message."""
    from haap_milp.problem import evaluate
    from haap_milp.solvers.common.branch_and_bound import _m_eff, _steady

    t, W = build_tables(sg, 0), _m_eff(sg.variants[0]) - 1
    scored = [(_steady(sg, a), evaluate(sg, a)) for a in plans]
    taus = sorted({tau for tau, _ in scored})
    checked = lifted = 0
    for cap in [taus[0], taus[len(taus) // 2], taus[-1]] if taus else []:
        rest = bounds.capped_rest(sg, t, cap)
        setattr(bounds, switch, False)
        try:
            plain = bounds.capped_rest(sg, t, cap)
        finally:
            setattr(bounds, switch, True)
        within = [T - W * tau for tau, T in scored if tau <= cap]
        if not within or rest is None or math.isinf(rest):
            continue
        checked += 1
        assert min(within) >= rest - 1e-9 * max(1.0, rest), (why, cap, min(within), rest)
        assert rest >= plain * (1 - 1e-12)
        lifted += rest > plain * (1 + 1e-6)
    return checked, lifted


def test_sync_floor_bounds_every_plan_within_its_cap(monkeypatch):
    """Eq. B2k (``bounds._sync_floor``): on random plain variants with their per-layer syncs made dear (k times a mean
    layer's time, so that the largest sync of a plan within a period cap outweighs what the earlier stages' backward
    hides), at caps from the plans' own periods, T - (M - 1) tau is at least the capped rest term for every plan within
    the cap (brute force), which is never below the rest term without eq. B2k; it lifts it on some (not vacuous).
    Eq. B2n is off in both arms (it takes B2k's floor and lifts most of the same terms further)."""
    from synthetic import feasible_plans

    monkeypatch.setattr(bounds, "USE_JOINT_REST", False)

    checked = lifted = 0
    for seed, problem, var, sub in _random_variants(range(12)):
        if var.vpp > 1 or build_tables(sub, 0).p_min == 0:
            continue
        plans = list(feasible_plans(sub))  # (memory and GPUs alone: the same for every sync below)
        unit = float(np.mean(var.layer_time))
        for k, ends in ((2.0, 0.0), (8.0, 0.0), (32.0, 0.0), (2.0, 3.0), (8.0, 3.0)):
            dear = replace(var, sync_per_layer=np.asarray(var.sync_per_layer) * k * unit
                           / max(float(np.mean(var.sync_per_layer)), 1e-12),
                           sync_first=np.asarray(var.sync_first) + ends * k * unit,  # (the end stages' own syncs)
                           sync_last=np.asarray(var.sync_last) + ends * k * unit)
            c, n = _capped_against_brute(replace(problem, variants=(dear,)), plans, "USE_SYNC_FLOOR", (seed, k, ends))
            checked, lifted = checked + c, lifted + n
    assert checked >= 300 and lifted >= 30, (checked, lifted)  # (measured: 360, 38)


def test_joint_rest_bounds_every_plan_within_its_cap():
    """Eq. B2n (``rest_dp.joint_rest``): on random plain variants, blocking and not, as they are and with their
    per-layer syncs made dear, at caps from the plans' own periods, T - (M - 1) tau is at least the capped rest term
    for every plan within the cap (brute force), never below the term without eq. B2n; it lifts it on some."""
    from synthetic import feasible_plans

    checked = lifted = 0
    for seed, problem, var, sub in _random_variants(range(12)):
        if var.vpp > 1 or build_tables(sub, 0).p_min == 0:
            continue
        plans = list(feasible_plans(sub))
        unit = float(np.mean(var.layer_time))
        for blocking in (False, True):
            for k in (None, 2.0, 8.0):
                dear = var if k is None else replace(var, sync_per_layer=np.asarray(var.sync_per_layer) * k * unit
                                                     / max(float(np.mean(var.sync_per_layer)), 1e-12))
                c, n = _capped_against_brute(replace(problem, variants=(dear,), p2p_blocking=blocking), plans,
                                             "USE_JOINT_REST", (seed, blocking, k))
                checked, lifted = checked + c, lifted + n
    assert checked >= 400 and lifted >= 150, (checked, lifted)  # (measured: 432, 221)


def test_capped_fill_bounds_every_plan_within_its_cap():
    """Eq. B2i (``bounds.capped_rest``): on the plain variants and interleaved copies above, at caps taken from the
    plans' own periods, T - (M - 1/vpp) tau is at least the capped rest term for every plan (brute force) whose tau
    lies within the cap (+inf only where none does), and never below eq. B2's rest term. It lifts that term on some
    of them (not vacuous; the by-hand case below shows a lift exactly)."""
    from synthetic import feasible_plans

    from haap_milp.problem import evaluate
    from haap_milp.solvers.common.branch_and_bound import _m_eff, _steady

    checked = lifted = 0
    for seed, problem, var, sub in _random_variants(range(12)):
        t = build_tables(sub, 0)
        if t.p_min == 0 or t.n == 0:
            continue
        W, base = _m_eff(var) - 1, bounds._rest_bound(sub, t)
        plans = [(_steady(sub, a), evaluate(sub, a)) for a in feasible_plans(sub)]
        taus = sorted({tau for tau, _ in plans})
        for cap in ([taus[0] * 0.999, taus[0], taus[len(taus) // 2], taus[-1]] if taus else [1.0]):
            rest = bounds.capped_rest(sub, t, cap)
            within = [T - W * tau for tau, T in plans if tau <= cap]
            assert rest is not None and not (within and math.isinf(rest))  # (+inf: no plan within the cap)
            if within:
                checked += 1
                assert min(within) >= rest - 1e-9 * max(1.0, rest), (seed, cap, min(within), rest)
                assert rest >= base * (1 - 1e-6)  # (the cap only adds rows to eq. B2e's LP)
                lifted += rest > base * (1 + 1e-6)
    assert checked >= 100 and lifted >= 10, (checked, lifted)


def test_capped_fill_lifts_by_hand():
    """Eq. B2i by hand: one 4-GPU stage of group a (0.1 s a layer) and 1-GPU stages of group b (0.2 s), 8 layers on
    exactly 3 stages (vpp 2). Eq. B2e puts 6 layers on a's stage: sum_j t_j >= 0.6 + 2 x 0.2 = 1.0 s. Within a period
    cap of 0.4 s a's stage holds 4 layers and b's 2 each: 0.4 + 4 x 0.2 = 1.2 s, the best such plan's (brute force);
    within 0.35 s (3 + 1 + 1 layers) no plan: +inf."""
    from synthetic import feasible_plans

    from haap_milp.solvers.common.branch_and_bound import _steady

    opts = (Option(0, 1, 4, 1, "none"), Option(1, 1, 1, 1, "none"))
    var = replace(_variant(2, [0.1, 0.2], np.zeros((2, 2))), num_microbatches=6, vpp=2, num_stages=3)
    prob = Problem(num_layers=8, max_stages=3, groups=("a", "b"), group_capacity=(4, 4), options=opts, variants=(var,))
    t = build_tables(prob, 0)
    assert bounds._rest_bound(prob, t) == pytest.approx(1.0 / 2, rel=1e-6)  # eq. I1: sum t / vpp
    assert bounds.capped_rest(prob, t, 0.4) == pytest.approx(1.2 / 2, rel=1e-6)
    assert bounds.capped_rest(prob, t, 0.35) == math.inf
    fills = [sum(stage_times(prob, a)) for a in feasible_plans(prob) if _steady(prob, a) <= 0.4 * (1 + 1e-12)]
    assert min(fills) == pytest.approx(1.2)
    assert not [a for a in feasible_plans(prob) if _steady(prob, a) <= 0.35]


def test_forced_sync_lifts_by_hand():
    """Eq. B2j by hand: 4 layers on a stage of group a (0.1 s a layer, 2 layers in memory) and one of group b (0.2 s,
    a 1 s sync), M = 8, so every plan needs b. Within a period cap of 0.4 s eq. B2i gives fill 0.6 s + sigma 0 (a's
    stage syncs nothing); b's stage after a's hides beta x 0.2 s of its sync: the best plan [a 2, b 2] has
    T - 7 tau = 0.6 + 1 - 0.2 x 2/3 = 1.4667 s (brute force). Eq. B2j: (1 - beta) 0.6 + 1 + beta 0.2 = 1.3333 s."""
    from synthetic import feasible_plans

    from haap_milp.problem import evaluate
    from haap_milp.solvers.common.branch_and_bound import _steady

    opts = (Option(0, 1, 1, 1, "none"), Option(1, 1, 1, 1, "none"))
    var = _variant(2, [0.1, 0.2], np.zeros((2, 2)), layer_static_mem=np.array([1.0, 0.0]),
                   mem_capacity=np.array([2.5, 1e15]), sync_fixed=np.array([0.0, 1.0]))
    prob = Problem(num_layers=4, max_stages=2, groups=("a", "b"), group_capacity=(1, 1), options=opts, variants=(var,))
    t = build_tables(prob, 0)
    beta = pipeline.BWD_SHARE
    rests = [evaluate(prob, a) - 7 * _steady(prob, a) for a in feasible_plans(prob) if _steady(prob, a) <= 0.4]
    assert min(rests) == pytest.approx(0.6 + 1.0 - 0.2 * beta)
    assert bounds.capped_rest(prob, t, 0.4) == pytest.approx((1 - beta) * 0.6 + 1.0 + beta * 0.2)
    bounds.USE_FORCED_SYNC = bounds.USE_JOINT_REST = False
    try:  # eq. B2k alone: every plan within the cap needs b's stage, whose sync is S >= 1 s: 0.6 + (1 - beta 0.6)
        assert 1.2 * (1 - 1e-2) <= bounds.capped_rest(prob, t, 0.4) <= 1.2
        bounds.USE_SYNC_FLOOR = False
        assert bounds.capped_rest(prob, t, 0.4) == pytest.approx(0.6)  # eq. B2i alone
        bounds.USE_JOINT_REST = True  # eq. B2n alone: a holds 2 layers on its one GPU, so b's stage (S = 1 s) the rest
        assert bounds.capped_rest(prob, t, 0.4) == pytest.approx((1 - beta) * 0.6 + 1.0)
    finally:
        bounds.USE_FORCED_SYNC = bounds.USE_SYNC_FLOOR = bounds.USE_JOINT_REST = True


def test_forced_sync_bounds_every_plan_within_its_cap(monkeypatch):
    """Eq. B2j (``bounds._forced_sync``): on random plain variants and interleaved copies with one group's syncs made
    dear (its sync_fixed + a mean stage's time, so that a plan using it pays), at caps from the plans' own periods,
    T - (M - 1/vpp) tau is at least the capped rest term for every plan within the cap (brute force), which is never
    below eq. B2i's; it lifts eq. B2i's on some (not vacuous). Eqs. B2k and B2n are off in both arms (B2k's bisection
    starts from the sync it is given, so with B2j its last digits differ; B2n lifts most of the same terms further)."""
    from synthetic import feasible_plans

    monkeypatch.setattr(bounds, "USE_SYNC_FLOOR", False)
    monkeypatch.setattr(bounds, "USE_JOINT_REST", False)

    checked = lifted = 0
    for seed, problem, var, sub in _random_variants(range(10)):
        if build_tables(sub, 0).p_min == 0:
            continue
        plans = list(feasible_plans(sub))  # (memory and GPUs alone: the same for every sync below)
        for g in range(len(problem.groups)):
            on = np.array([o.group == g for o in problem.options], float)
            dear = replace(var, sync_fixed=np.asarray(var.sync_fixed) + on * 3 * float(np.mean(var.layer_time)))
            c, n = _capped_against_brute(replace(problem, variants=(dear,)), plans, "USE_FORCED_SYNC", (seed, g))
            checked, lifted = checked + c, lifted + n
    assert checked >= 300 and lifted >= 50, (checked, lifted)  # (measured: 417, 89: every group made dear in turn)
