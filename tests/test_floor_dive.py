"""Eq. LS4c (the floor dive before branching) against brute force: on random three-group problems, every variant's
bound after the dive (its period floor from eq. N11b's bisection, or eq. X1's cap where no plan beats the incumbent)
stays at or below every feasible plan of that variant, in tau and in T; the plans it offers are feasible; and it is not
vacuous: it lifts some variant's period floor above eq. B2's."""

from __future__ import annotations

import math
import pathlib
import sys
import time
from functools import cache

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import feasible_assignments, feasible_plans, random_problem

from haap_milp import worker
from haap_milp.problem import evaluate, violations
from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.solvers.common.bounds import variant_bound
from haap_milp.solvers.common.slot_bounds import build_tables


def test_feasible_plans_are_the_feasible_assignments():
    """``feasible_plans`` yields what ``feasible_assignments`` does, in its order, on problems where each of its
    skips applies (GPU counts, memory, uniform and same-tp targets, a budget band, an interleaved copy's stage count
    (P = 4, with plans of its own on five of the six), a time bound: each breaks some of these problems' plans), and
    per variant and stage limit."""
    import dataclasses

    from haap_milp.interleave import interleaved_variants
    from haap_milp.problem import Budget

    checked = 0
    for seed in range(6):
        base = random_problem(seed, num_layers=5, max_stages=4, max_options=3, num_variants=1,
                              uniform=seed % 3 == 0, same_tp_first_last=seed % 2 == 0)
        problem = dataclasses.replace(base, variants=base.variants + tuple(
            interleaved_variants(base.variants, (2,), base.max_stages, base.num_layers)))
        w = np.arange(1, problem.num_options + 1, dtype=np.int64)
        banded = dataclasses.replace(problem, budget=Budget(w, int(w.sum()), "test", int(w.max())))
        want = list(feasible_assignments(problem))
        timed = dataclasses.replace(problem, max_time_s=float(np.median([evaluate(problem, a) for a in want]))) \
            if want else problem
        for p in (problem, banded, timed):
            plans = list(feasible_plans(p))
            assert plans == list(feasible_assignments(p)), seed
            assert list(feasible_plans(p, [0], 2)) == [a for a in plans if a.variant == 0 and len(a.stages) <= 2]
            checked += len(plans) > 0
    assert checked >= 10, checked


@cache
def _dive_case(seed: int):
    """The first test's random three-group problem of ``seed``, its loosest plan, and per variant the least tau and
    T over its plans (inf: none); None where it has no plan or one GPU type. Built once for the three
    parametrizations."""
    problem = random_problem(seed, num_groups=3, uniform=False, same_tp_first_last=False)
    if len({g.rsplit("@", 1)[0] for g in problem.groups}) < 2:
        return None
    plans = list(feasible_plans(problem))
    if not plans:
        return None
    least = np.full((len(problem.variants), 2), math.inf)
    for a in plans:
        least[a.variant] = np.minimum(least[a.variant], (bb._steady(problem, a), evaluate(problem, a)))
    return problem, max(plans, key=lambda a: evaluate(problem, a)), least


def _assert_below_every_plan(vb, least, seed) -> None:
    """Each variant's bound at or below every plan of the variant, in tau and in T (its least ones: ``least``)."""
    for v, (b, (tau, T)) in enumerate(zip(vb, least)):
        assert tau >= b.tau_lb * (1 - 1e-9), (seed, v, tau, b.tau_lb)
        assert T >= b.total_s * (1 - 1e-9) - 1e-12, (seed, v, T, b.total_s)


@pytest.mark.parametrize(("threads", "share"), [(1, False), (2, False), (2, True)])
def test_floor_dive_bounds_hold_for_every_plan_and_lift_some(monkeypatch, threads, share):
    """``threads`` 2: eq. PAR5c, the variants dived here and on a forked child, its floors and plan taken back here;
    ``share``: eq. PAR5e, the two take the variants from one shared list and read each other's best plan time (a cap
    from the other process's plan still gives floors that hold for every plan)."""
    monkeypatch.setattr(bb, "DIVE_VARIANTS", 99)
    monkeypatch.setattr(bb, "SHARE_DIVE", share)
    monkeypatch.setattr(worker, "cpus", lambda: 2)
    checked = lifted = 0
    offered: list = []
    real_offer = bb._State.offer
    for seed in range(30):
        case = _dive_case(seed)
        if case is None:
            continue
        problem, worst, least = case
        st = bb._State(several_types=True)
        st.inc, st.inc_obj = worst, evaluate(problem, worst)  # a loose incumbent: the caps stay high
        vb = [variant_bound(problem, build_tables(problem, v)) for v in range(len(problem.variants))]
        before = [b.tau_lb for b in vb]
        offered.clear()
        monkeypatch.setattr(bb._State, "offer",
                            lambda self, p, a, who, **kw: offered.append(a) or real_offer(self, p, a, who, **kw))
        bb._floor_dive(problem, st, vb, 0.0, math.inf, math.inf, "test", threads)
        monkeypatch.setattr(bb._State, "offer", real_offer)
        _assert_below_every_plan(vb, least, seed)
        assert all(a is None or not violations(problem, a) for a in offered)
        checked += 1
        lifted += any(b.tau_lb > t * (1 + 1e-6) for b, t in zip(vb, before) if math.isfinite(b.total_s))
    assert checked >= 8 and lifted >= 2, (checked, lifted)


def test_floor_dive_on_an_interleaved_incumbent_holds_for_every_plan(monkeypatch):
    """Where the incumbent is an interleaved copy (vpp 2, 3) its own variant is dived first (eq. LS4c), with tau's
    weight M - 1/vpp (eq. I1) and the links at vpp c/2 (eq. I6): every variant's bound stays at or below its plans."""
    from dataclasses import replace

    from haap_milp.interleave import interleaved_variants

    monkeypatch.setattr(worker, "cpus", lambda: 2)
    checked = lifted = 0
    for seed in range(30):
        base = random_problem(seed, num_groups=3, num_layers=6, max_stages=4, max_options=4, uniform=False,
                              same_tp_first_last=False)
        copies = tuple(interleaved_variants(base.variants, (2, 3), base.max_stages, base.num_layers))
        if not copies or len({g.rsplit("@", 1)[0] for g in base.groups}) < 2:
            continue
        problem = replace(base, variants=base.variants + copies)
        plans = list(feasible_plans(problem))
        inter = [a for a in plans if problem.variants[a.variant].vpp > 1]
        if not inter:
            continue
        st = bb._State(several_types=True)
        worst = max(inter, key=lambda a: evaluate(problem, a))
        st.inc, st.inc_obj = worst, evaluate(problem, worst)
        vb = [variant_bound(problem, build_tables(problem, v)) for v in range(len(problem.variants))]
        before = vb[worst.variant].tau_lb
        bb._floor_dive(problem, st, vb, 0.0, math.inf, math.inf, "test", 2)
        least = np.full((len(problem.variants), 2), math.inf)
        for a in plans:
            least[a.variant] = np.minimum(least[a.variant], (bb._steady(problem, a), evaluate(problem, a)))
        _assert_below_every_plan(vb, least, seed)
        checked += 1
        lifted += vb[worst.variant].tau_lb > before * (1 + 1e-6)
    assert checked >= 6 and lifted >= 2, (checked, lifted)


def test_dive_order_on_an_interleaved_incumbent_takes_its_neighbours_by_m_and_stages_per_micro_batch():
    """Eq. LS4d: after an interleaved incumbent's own variant come the variants of its vpp (and vpp 1) within a factor
    DIVE_M_RATIO of its M, nearest M first, its own vpp before vpp 1, then the P / M nearest its own (twice M at twice
    P: the same GPUs at half the data parallelism); other vpps and farther M are left out. A vpp-1 incumbent keeps
    eq. LS4c's DIVE_VARIANTS of vpp 1, and (eq. LS4k) its stage count interleaved second: the copy of the nearest
    stage count, then the nearest M, then the most chunks."""
    from types import SimpleNamespace as V

    grid = [V(num_microbatches=m, vpp=1, num_stages=0) for m in (8, 16, 32, 64, 128)]
    grid += [V(num_microbatches=m, vpp=vpp, num_stages=p) for m in (16, 32, 64) for vpp in (2, 4) for p in (8, 16, 32)]
    problem = V(variants=grid)
    home = next(v for v, w in enumerate(grid) if (w.num_microbatches, w.vpp, w.num_stages) == (32, 4, 16))
    key = [(grid[v].num_microbatches, grid[v].vpp, grid[v].num_stages) for v in bb._dive_order(problem, home)]
    assert key[0] == (32, 4, 16)
    # its other stage counts, then its M at vpp 1, then M / 2 and 2 M at P / M = 1/2 as at home (before (16, 4, 16))
    assert key[1:6] == [(32, 4, 8), (32, 4, 32), (32, 1, 0), (16, 4, 8), (64, 4, 32)], key
    assert all(vpp in (1, 4) for _, vpp, _ in key) and all(16 <= m <= 64 for m, _, _ in key)
    want = {(m, vpp, p) for m, vpp, p in ((w.num_microbatches, w.vpp, w.num_stages) for w in grid)
            if vpp in (1, 4) and 16 <= m <= 64}
    assert set(key) == want and len(key) == len(want)
    flat = bb._dive_order(problem, 2)  # M = 32, vpp 1 (its stage count not given: no copy)
    assert [grid[v].num_microbatches for v in flat] == [32, 16, 64] and all(grid[v].vpp == 1 for v in flat)
    with_copy = [(grid[v].num_microbatches, grid[v].vpp, grid[v].num_stages) for v in bb._dive_order(problem, 2, 14)]
    assert with_copy == [(32, 1, 0), (32, 4, 16), (16, 1, 0), (64, 1, 0)], with_copy  # (14 stages: 16 the nearest)
    far = [(grid[v].num_microbatches, grid[v].vpp, grid[v].num_stages) for v in bb._dive_order(problem, 0, 30)]
    assert far == [(8, 1, 0), (16, 4, 32), (16, 1, 0), (32, 1, 0)], far  # (M 8: the copies of M 16 alone within 2x)


def _dived_problem(seed_range=range(40)):
    """A random three-group problem with a loose incumbent (its worst plan) on which the dive runs, with its plans."""
    for seed in seed_range:
        problem = random_problem(seed, num_groups=3, uniform=False, same_tp_first_last=False)
        plans = list(feasible_assignments(problem))
        if len(plans) < 3 or len({g.rsplit("@", 1)[0] for g in problem.groups}) < 2:
            continue
        return problem, plans
    raise AssertionError("no problem")


def test_dive_retries_the_segment_plan_at_growing_slack_below_the_cap_until_one_holds(monkeypatch):
    """Eq. LS4e: where eq. LS4's run at DIVE_SLACK above a variant's floor gives no plan, it runs again at each larger
    slack of DIVE_SLACKS while that stays below eq. X1's cap, and stops at the first that gives a plan (or at once
    where no DP applies to the variant)."""
    problem, plans = _dived_problem()
    worst = max(plans, key=lambda a: evaluate(problem, a))
    calls: dict = {}

    def run(give_at: int, no_dp: bool = False):
        calls.clear()

        def fake(prob, v, b, island, ran=None, inc_obj=math.inf, stop=math.inf):
            calls.setdefault(v, []).append(b)
            if ran is not None and not no_dp:
                ran.append(True)
            return worst if len(calls[v]) == give_at else None

        monkeypatch.setattr(bb, "_segment_at", fake)
        st = bb._State()
        st.inc, st.inc_obj = worst, evaluate(problem, worst)
        vb = [variant_bound(problem, build_tables(problem, v)) for v in range(len(problem.variants))]
        caps = {v: (st.inc_obj - b.rest_lb) / (bb._m_eff(problem.variants[v]) - 1) for v, b in enumerate(vb)}
        bb._dive(problem, st, vb, 0.0, math.inf, math.inf, "test", list(range(len(problem.variants))))
        return caps

    caps = run(give_at=0)  # never a plan: every slack below the cap is tried, in order
    ratios = [(1 + b) / (1 + a) for a, b in zip(bb.DIVE_SLACKS, bb.DIVE_SLACKS[1:])]
    assert calls and any(len(bs) > 1 for bs in calls.values())
    for v, bs in calls.items():
        assert all(b <= caps[v] * (1 + 1e-12) for b in bs[1:]), (v, bs, caps[v])
        assert all(abs(y / x - r) < 1e-9 for x, y, r in zip(bs, bs[1:], ratios)), bs
        hi = bs[0] / (1 + bb.DIVE_SLACKS[0])
        nxt = hi * (1 + bb.DIVE_SLACKS[len(bs)]) if len(bs) < len(bb.DIVE_SLACKS) else math.inf
        assert nxt > caps[v], (v, bs, caps[v])  # it stopped only at the cap (or the last slack)
    run(give_at=2)  # a plan at the second slack: no third run
    assert calls and all(len(bs) <= 2 for bs in calls.values()) and any(len(bs) == 2 for bs in calls.values())
    run(give_at=0, no_dp=True)  # no DP applies to the variant: one run, no retry
    assert calls and all(len(bs) == 1 for bs in calls.values())


@pytest.mark.parametrize("first_plan", [True, False])
def test_dive_runs_its_first_plan_after_its_clock_ended_the_bisection(monkeypatch, first_plan):
    """Eq. LS4i: where the dive's clock (``until``) ends a variant's bisection before the segment plan, the process's
    first plan still runs, at the bracket's top, stopped after FIRST_PLAN_DIVES more dives' time (``stop``); no later
    variant is begun, and without FIRST_PLAN no plan runs at all."""
    problem, plans = _dived_problem()
    worst = max(plans, key=lambda a: evaluate(problem, a))
    calls: list = []

    def fake(prob, v, b, island, ran=None, inc_obj=math.inf, stop=math.inf):
        calls.append((v, b, stop, time.perf_counter()))
        if ran is not None:
            ran.append(True)

    real = bb._holds_no_plan

    def slow(prob, v, b):  # every probe takes 60 ms: the 100 ms clock ends the first variant's bisection
        time.sleep(0.06)
        return real(prob, v, b)

    monkeypatch.setattr(bb, "_segment_at", fake)
    monkeypatch.setattr(bb, "_holds_no_plan", slow)
    monkeypatch.setattr(bb, "FIRST_PLAN", first_plan)
    st = bb._State()
    st.inc, st.inc_obj = worst, evaluate(problem, worst)
    vb = [variant_bound(problem, build_tables(problem, v)) for v in range(len(problem.variants))]
    order = [worst.variant] + [v for v in range(len(problem.variants)) if v != worst.variant]
    start = time.perf_counter()
    until = start + 0.1
    bb._dive(problem, st, vb, 0.0, until, math.inf, "test", order)
    if not first_plan:
        assert calls == []
        return
    assert len(calls) == 1, calls  # the first plan only: no later slack, no later variant
    v, _b, stop, at = calls[0]
    assert v == worst.variant and at >= until  # begun after the clock
    assert stop <= at + bb.FIRST_PLAN_DIVES * (until - start) + 1e-3  # FIRST_PLAN_DIVES more dives' time at most


def test_segment_plan_past_its_stop_gives_no_plan():
    """Eq. LS4i's ``stop``: a segment DP run whose stop has passed ends with no plan; with no stop it is the plan of a
    run without one."""
    from haap_milp.solvers.common import segment_dp
    from haap_milp.solvers.common.stage_dp import PathDP

    found = 0
    for seed in range(40):
        problem = random_problem(seed, num_groups=3, uniform=False, same_tp_first_last=False)
        island = problem.group_island
        for v in range(len(problem.variants)):
            t = build_tables(problem, v)
            if t.p_min == 0:
                continue
            dp = PathDP(problem, t, math.inf, t.p_min, t.p_max)
            if not segment_dp.applies(dp, island):
                continue
            plan = segment_dp.segment_plan(dp, island)
            if plan is None:
                continue
            assert segment_dp.segment_plan(dp, island, stop=math.inf) == plan
            assert segment_dp.segment_plan(dp, island, stop=time.perf_counter() - 1.0) is None
            found += 1
    assert found >= 5, found


def test_offer_with_a_margin_polishes_a_plan_above_the_incumbent_and_keeps_it_only_if_better(monkeypatch):
    """Eq. LS4f: ``offer(..., margin)`` polishes a plan up to that share above the incumbent (eq. LS1) and keeps the
    polished plan only where it beats the incumbent; without a margin a plan above the incumbent is not polished."""
    problem, plans = _dived_problem()
    ranked = sorted(plans, key=lambda a: evaluate(problem, a))
    best, mid = ranked[0], ranked[len(ranked) // 2]
    polished: list = []

    class FakePolish:  # the polish "finds" ``target``
        target = best

        def __init__(self, prob, a, moves):
            polished.append(a)
            self.best, self.optimal = FakePolish.target, True

        def step(self, n):
            return None

    monkeypatch.setattr(bb, "Polish", FakePolish)
    st = bb._State()
    st.inc, st.inc_obj = mid, evaluate(problem, mid)
    from haap_milp.solvers.common.hints import canonical

    def kept_form(a):  # what ``offer`` keeps of a polished plan: its canonical form (eqs. D1, S1)
        return evaluate(problem, canonical(problem, build_tables(problem, a.variant), a))

    worse = next(a for a in ranked if evaluate(problem, a) > st.inc_obj and kept_form(a) > st.inc_obj)
    margin = evaluate(problem, worse) / st.inc_obj - 1 + 1e-9
    st.offer(problem, worse, "test")
    assert not polished and st.inc is mid  # above the incumbent, no margin: not polished
    FakePolish.target = worse  # a polish that does not beat the incumbent: the incumbent stays
    st.offer(problem, worse, "test", margin=margin)
    assert polished == [worse] and st.inc_obj == evaluate(problem, mid)
    FakePolish.target = best  # a polish that beats it: kept
    st.offer(problem, worse, "test", margin=margin)
    assert st.inc_obj == pytest.approx(evaluate(problem, best)) and st.inc_obj < evaluate(problem, mid)


def test_segment_plans_cap_the_later_stages_syncs_where_they_set_sigma(monkeypatch):
    """Eq. LS4h on qwen3-235b-a22b x hetero3-1024 (gbs 2048), the variant of M 64, vpp 4, 16 stages at the period of
    the best plan known (8.1035 s, tau 0.11733 s): eq. LS4 prices the first stage's sync alone, and its plan puts 10
    layers on 128 A100-80 whose 0.83 s sync sets sigma (8.6525 s); with sigma capped (the later stages' syncs, eq.
    T3's offset by the stages before them, the first stage's sync free up to the cap) the plans reach 8.1124 s, 0.11 %
    above that plan and below the DP heuristic's 8.1849 s."""
    from haap_milp import planner
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.specs import SolveOptions, TrainingSpec
    from haap_milp.specs.solve import SOLVE_SPACE

    opts = SolveOptions(time_limit_s=10, threads=1, **SOLVE_SPACE)
    ctx = planner.Context.build(load_model("qwen3-235b-a22b"), load_cluster("hetero3-1024"),
                                TrainingSpec(global_batch_size=2048, seq_len=4096), opts, None)
    problem = ctx.presolved.problem
    v = next(i for i, w in enumerate(problem.variants)
             if (w.num_microbatches, w.vpp, w.num_stages) == (64, 4, 16))
    best = {}
    for on in (False, True):
        monkeypatch.setattr(bb, "USE_SYNC_CAP", on)
        plan = bb._segment_at(problem, v, 0.11733 * 1.003, problem.group_island)
        assert plan is not None and violations(problem, plan) == []
        best[on] = evaluate(problem, plan)
    assert best[False] > 8.6 and best[True] < 8.12, best
