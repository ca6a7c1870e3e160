"""Eq. N25 (eq. N20's joint DP by cases on the crossings between islands) against the node-level brute-force oracle.

The instances are random two-group problems copied onto a second island (``test_island_split.mirrored``: the copy
slower by a factor, links between the islands of a given price), so each GPU type sits on two islands and eq. N20 pools
it; capacities are tightened so that one island cannot hold every stage. Per node and stage count P the crossing bound
must never exceed the least plan of P stages in the node (every plan enumerated, ``evaluate`` and ``violations``), must
never be below eq. N20's pooled value, and must lift it on a good share of the nodes. The test fails when a case leaves
plans out (checked by mutation: the at-most-once case without its crossing or with the units kept across it, the
twice-or-more case closing nothing, one unit less of island capacity)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import assert_exact_solvers_match_brute
from test_island_split import mirrored
from test_stage_dp import _node_plans

from haap_milp.solvers.common import island_crossings, joint_capacity
from haap_milp.solvers.common.bounds import variant_bound
from haap_milp.solvers.common.branch_and_bound import _worst_tau
from haap_milp.solvers.common.capacity_dp import island_blocks
from haap_milp.solvers.common.island_split import gpu_type
from haap_milp.solvers.common.slot_bounds import build_tables
from haap_milp.solvers.common.stage_dp import PathDP
from haap_milp.specs import SolveOptions

TOL = 1e-9
EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)


def _instance(seed: int, rng) -> object:
    """A mirrored problem whose islands each hold a share of the pooled GPUs too small for every stage alone."""
    p = mirrored(seed, slow=float(rng.uniform(1.0, 1.5)), cross_s=float(rng.uniform(0.005, 0.05)),
                 num_layers=int(rng.integers(4, 7)), max_stages=int(rng.integers(3, 5)), max_options=3)
    caps = np.asarray(p.group_capacity, float)
    return dataclasses.replace(p, group_capacity=tuple(int(max(1, c // 2)) for c in caps))


def _check(p, rng) -> tuple[int, int]:
    """Every node of every variant: (nodes checked with a plan, nodes whose bound the cases lift above eq. N20's)."""
    types = [gpu_type(g) for g in p.groups]
    checked = lifted = 0
    for v in range(len(p.variants)):
        plans = _node_plans(p, v)
        if not plans:
            continue
        t0 = build_tables(p, v)
        vb = variant_bound(p, t0)
        bot, top = vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01
        edges = np.sort(np.concatenate([[bot, top], rng.uniform(bot, top, 2)]))
        for a, b in itertools.pairwise(edges.tolist()):
            t = build_tables(p, v, b)
            if t.p_min == 0:
                continue
            dp = PathDP(p, t, b, t.p_min, t.p_max)
            blocks = island_blocks(p, dp)
            full = joint_capacity.joint_units(dp, types)
            if blocks is None or full is None:
                continue
            pooled = joint_capacity._units(dp, joint_capacity.type_blocks(types))
            mu = np.zeros(len(dp.cap))
            base = joint_capacity.least_paths(dp, a, mu, pooled)
            cb = island_crossings.crossing_bound(dp, a, mu, pooled, types, p.group_island, blocks)
            assert cb is not None
            inside = [(P, T) for P, tau, T, _ in plans if a * (1 - 1e-12) <= tau <= b * (1 + 1e-9)]
            for P in range(t.p_min, t.p_max + 1):
                least = min((T for q, T in inside if q == P), default=math.inf)
                assert cb[P] <= least * (1 + TOL) + 1e-12, (v, a, b, P, cb[P], least)
                # (the twice-or-more case runs in float32, eq. N27b: its values lose their rounding's bound, < 1e-5)
                assert cb[P] >= base.get(P, math.inf) * (1 - 1e-5) - 1e-12, (v, a, b, P, cb[P], base.get(P))
            if inside:
                checked += 1
                lifted += float(cb.min()) > min(base.values(), default=math.inf) * (1 + 1e-6)
    return checked, lifted


def test_crossing_cases_never_exceed_a_nodes_least_plan_and_lift_the_pooled_bound():
    rng = np.random.default_rng(5)
    checked = lifted = 0
    for seed in range(30):
        c, lf = _check(_instance(seed, rng), rng)
        checked, lifted = checked + c, lifted + lf
    assert checked >= 40 and lifted >= checked // 8, (checked, lifted)


def test_island_units_take_each_islands_capacity_per_type():
    rng = np.random.default_rng(1)
    p = _instance(3, rng)
    t = build_tables(p, 0)
    dp = PathDP(p, t, math.inf, t.p_min, t.p_max)
    types = [gpu_type(g) for g in p.groups]
    u = island_crossings.island_units(dp, types, p.group_island, island_blocks(p, dp))
    caps = np.asarray(p.group_capacity)
    G = len(caps) // 2  # (mirrored: groups 0..G-1 on island "a", their copies on "b")
    for r in np.flatnonzero(u.off >= 0).tolist():
        island = int(p.group_island[np.flatnonzero(dp.row_usage[r, :dp.G] > 0)[0]])
        own = caps[:G] if island == 0 else caps[G:]
        q = np.asarray([math.gcd(*map(int, dp.usage[:, [g, g + G]].sum(axis=1).tolist())) for g in range(G)])
        want = np.where(q > 0, own // np.maximum(q, 1), 0)  # (a type no option takes: no units, eq. N20j)
        assert (u.limit[r] == want).all(), (r, u.limit[r], own, q)


def test_exact_solvers_keep_brute_force_optimum_with_the_cases(monkeypatch):
    """End to end with eq. N20 forced to pool (a JOINT_MAX below every group's own digits): CP-SAT and the MILP still
    return brute force's optimum, with a bound at or below it."""
    monkeypatch.setattr(joint_capacity, "JOINT_MAX", 64)
    rng = np.random.default_rng(9)
    proven = 0
    for seed in range(8):
        ref = assert_exact_solvers_match_brute(_instance(seed, rng), EXACT, check_bound=True)
        proven += ref.status == "OPTIMAL"
    assert proven >= 4, proven


def test_tau_cap_of_the_joint_bounds_keeps_every_plan_below_the_cutoff():
    """Eq. N26: with eq. N20's (and N25's) bound at a node's lower end, no plan of the node below a cut-off has its
    period above ``joint_capacity.tau_cap``; and the cap cuts nodes (it fails with the tau weight doubled)."""
    rng = np.random.default_rng(13)
    cut = checked = 0
    for seed in range(30):
        p = _instance(seed, rng)
        types = [gpu_type(g) for g in p.groups]
        for v in range(len(p.variants)):
            plans = _node_plans(p, v)
            if not plans or p.variants[v].num_microbatches < 2:
                continue
            t0 = build_tables(p, v)
            vb = variant_bound(p, t0)
            edges = np.linspace(vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01, 4)
            for a, b in itertools.pairwise(edges.tolist()):
                t = build_tables(p, v, b)
                if t.p_min == 0:
                    continue
                dp = PathDP(p, t, b, t.p_min, t.p_max)
                u = joint_capacity.joint_units(dp, types)
                blocks = island_blocks(p, dp)
                if u is None:
                    continue
                mu = np.zeros(len(dp.cap))
                per = np.full(dp.k_max + 1, math.inf)
                for P, x in joint_capacity.least_paths(dp, a, mu, u).items():
                    per[P] = x
                if blocks is not None and len(u.R) < dp.G:
                    cb = island_crossings.crossing_bound(dp, a, mu, u, types, p.group_island, blocks)
                    per = per if cb is None else np.maximum(per, cb)
                inside = [(tau, T) for P, tau, T, _ in plans if a * (1 - 1e-12) <= tau <= b * (1 + 1e-9)]
                if not inside:
                    continue
                for cutoff in sorted({T for _, T in inside})[:3]:
                    cutoff *= 1 + 1e-6
                    cap = joint_capacity.tau_cap(dp, a, float(per.min()), cutoff)
                    for tau, T in inside:
                        assert not (T < cutoff and tau > cap), (seed, v, a, b, cutoff, cap, tau, T)
                    checked += 1
                    cut += cap < b - 0.1 * (b - a)
    assert checked >= 60 and cut >= 10, (checked, cut)


def test_traced_crossing_plans_fit_each_islands_gpus_and_cross_at_most_once():
    """Eq. N25b: the at-most-once case's least path, traced as a plan, has the case's stage count, holds every layer,
    takes no group past its GPUs (each island's GPUs of a type are one group here, so the case's rows are exact) and
    crosses between islands at most once; on most nodes where the case has a path a plan comes back. Fails when the
    trace skips the reset at the crossing or keeps a state across it (the plans then overfill a group)."""
    rng = np.random.default_rng(21)
    traced = finite = 0
    for seed in range(30):
        p = _instance(seed, rng)
        types = [gpu_type(g) for g in p.groups]
        caps = np.asarray(p.group_capacity)
        for v in range(len(p.variants)):
            t0 = build_tables(p, v)
            if t0.p_min == 0:
                continue
            vb = variant_bound(p, t0)
            for b in np.linspace(vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01, 4)[1:].tolist():
                t = build_tables(p, v, b)
                if t.p_min == 0:
                    continue
                dp = PathDP(p, t, b, t.p_min, t.p_max)
                blocks = island_blocks(p, dp)
                u1 = None if blocks is None else island_crossings.island_units(dp, types, p.group_island, blocks)
                if u1 is None:
                    continue
                plans: list = []
                once = joint_capacity.least_paths(dp, vb.tau_lb, np.zeros(len(dp.cap)),
                                                  island_crossings._with_digit(u1, 1), plans=plans,
                                                  links=island_crossings._AtMostOnce(blocks, u1.size))
                if not any(math.isfinite(x) for x in once.values()):
                    continue
                finite += 1
                traced += len(plans)
                for plan in plans:
                    P = min(once, key=once.get)
                    assert len(plan.stages) == P and sum(s.num_layers for s in plan.stages) == t.L
                    used = np.zeros(len(caps))
                    for s in plan.stages:
                        for g, n in p.options[s.option].usage:
                            used[g] += n
                    assert (used <= caps).all(), (seed, v, b, used, caps)
                    isl = [int(p.group_island[p.options[s.option].group]) for s in plan.stages]  # (one group each)
                    assert sum(x != y for x, y in itertools.pairwise(isl)) <= 1, isl
    assert finite >= 40 and traced >= finite * 3 // 4, (finite, traced)


def test_dive_offers_the_crossing_plan_beside_the_segment_plan(monkeypatch):
    """Eq. N25b in eq. LS4c's dive (``branch_and_bound._segment_at``): on the mirrored problems the crossing plan comes
    back on most variants, and the dive's plan is the better of it and eq. LS4's (where eq. LS4 has none, the crossing
    plan itself when it passes the check)."""
    from haap_milp.problem import evaluate, violations
    from haap_milp.solvers.common import branch_and_bound as bb

    rng = np.random.default_rng(4)
    found = used = tried = 0
    for seed in range(20):
        p = _instance(seed, rng)
        types = [gpu_type(g) for g in p.groups]
        for v in range(len(p.variants)):
            t0 = build_tables(p, v)
            if t0.p_min == 0:
                continue
            b = max(_worst_tau(t0), variant_bound(p, t0).tau_lb) * 1.01
            t = build_tables(p, v, b)
            if t.p_min == 0:
                continue
            dp = PathDP(p, t, b, t.p_min, t.p_max)
            blocks = island_blocks(p, dp)
            if blocks is None:
                continue
            tried += 1
            plan = island_crossings.crossing_plan(dp, types, p.group_island, blocks)
            found += plan is not None
            both = bb._segment_at(p, v, b, p.group_island)
            monkeypatch.setattr(bb, "USE_CROSSING_PLAN", False)
            alone = bb._segment_at(p, v, b, p.group_island)
            monkeypatch.setattr(bb, "USE_CROSSING_PLAN", True)
            obj = [math.inf if a is None or violations(p, a) else evaluate(p, a) for a in (both, alone, plan)]
            assert obj[0] <= min(obj[1], obj[2]) * (1 + 1e-12), (seed, v, obj)
            with monkeypatch.context() as m:  # (eq. LS4 without a plan: the dive's is the crossing plan's)
                m.setattr(bb.segment_dp, "segment_plan", lambda *args, **kw: None)
                only = bb._segment_at(p, v, b, p.group_island)
            if math.isfinite(obj[2]):
                assert only is not None and evaluate(p, only) == obj[2], (seed, v)
                used += 1
    assert tried >= 20 and found >= tried * 3 // 4 and used >= 10, (tried, found, used)
