"""The stage DP's Lagrangian node bound (eq. N4) against the brute-force oracle on random small instances."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import any_interleaved_copies, random_problem, with_binding_budget

from haap_milp.problem import violations
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import capacity_dp, sigma_dp, stage_dp
from haap_milp.solvers.common.bounds import variant_bound
from haap_milp.solvers.common.branch_and_bound import _steady, _worst_tau
from haap_milp.solvers.common.capacity_dp import capacity_bound
from haap_milp.solvers.common.slot_bounds import build_tables
from haap_milp.solvers.common.stage_dp import PathDP, node_bound
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)


def _partition_bound(problem, v: int, cuts: int, rng) -> float:
    """The least node bound over a random partition of variant v's tau range into ``cuts`` intervals."""
    t0 = build_tables(problem, v)
    vb = variant_bound(problem, t0)
    if not math.isfinite(vb.total_s):
        return math.inf
    bot, top = vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01  # eq. B2's tau bound, as the search's roots
    edges = np.sort(np.concatenate([[bot, top], rng.uniform(bot, top, cuts - 1)]))
    out = math.inf
    for a, b in itertools.pairwise(edges):
        t = build_tables(problem, v, float(b))
        if t.p_min == 0:
            continue  # no plan of this variant has every stage within b
        nb = node_bound(problem, t, float(a), float(b), t.p_min, t.p_max, None, rng.uniform(0, 1e-3, len(problem.groups)))
        s = int(rng.integers(0, len(problem.groups)))  # eq. N5 with any group in the state is a bound too
        cb, plan = capacity_bound(problem, PathDP(problem, t, float(b), t.p_min, t.p_max), float(a), nb.mu, s)
        out = min(out, max(nb.bound_s, cb))
        for p in (nb.plan, plan):  # a path within every group's GPUs is a feasible plan (its tau may be below a)
            assert p is None or violations(problem, p) == []
    return out


@pytest.mark.parametrize("rmax", [capacity_dp.RMAX, 2])  # 2: the floor-rounded capacity units of eq. N5
def test_node_bounds_never_exceed_the_optimum_and_close_in_on_it(rmax, monkeypatch):
    monkeypatch.setattr(capacity_dp, "RMAX", rmax)
    monkeypatch.setattr(stage_dp, "MAX_STEPS", 40)  # the relaxation's strength, not the search's step budget
    rng = np.random.default_rng(3)
    tight = 0
    checked = 0
    for seed in range(36):
        problem = random_problem(seed, uniform=False, same_tp_first_last=False)
        brute = get_solver("brute")(problem, EXACT)
        bounds = [_partition_bound(problem, v, int(rng.integers(1, 6)), rng) for v in range(len(problem.variants))]
        if brute.status == "INFEASIBLE":
            continue
        checked += 1
        lb = min(bounds)
        assert lb <= brute.objective_s * (1 + 1e-9) + 1e-12, (seed, lb, brute.objective_s)
        # not vacuous: at the optimum's own steady period (a = b = tau*) the bound is close to the optimum
        a = brute.assignment
        tau = _steady(problem, a)
        t = build_tables(problem, a.variant, tau)
        at = node_bound(problem, t, tau, tau, t.p_min, t.p_max, None).bound_s
        tight += at >= 0.95 * brute.objective_s
    assert checked >= 15 and tight >= checked * 3 // 4, (checked, tight)


def _with_mixed(problem, rng, pairs: int = 3):
    """``problem`` plus ``pairs`` synthetic mixed options (eq. H1), each with its own p2p endpoint (eq. H5): the
    replicas of two single-group options of different groups; memory the tighter one's, links the slower group's,
    times 0.6 x the slower one's (so that optima use them; only the Problem's semantics matter here, brute force is
    the judge)."""
    from dataclasses import replace

    from haap_milp.problem import Option, Replicas

    G, opts = len(problem.groups), list(problem.options)
    made = []
    for _ in range(50):
        i, j = (int(x) for x in rng.integers(0, len(opts), 2))
        oi, oj = opts[i], opts[j]
        if oi.mix or oj.mix or oi.group == oj.group:
            continue
        link = G + len(made)
        made.append((i, j, Option(group=oi.group, tp=oi.tp, dp=oi.dp + oj.dp, ep=1, recompute=oi.recompute,
                                  mix=(Replicas(oi.group, oi.tp, oi.dp, 1), Replicas(oj.group, oj.tp, oj.dp, 1)),
                                  link=link)))
        if len(made) == pairs:
            break
    if not made:
        return None
    worst = ("layer_time", "first_time", "last_time", "layer_static_mem", "layer_act_mem", "first_static_mem",
             "first_act_mem", "last_static_mem", "last_act_mem", "fixed_mem", "sync_fixed", "sync_per_layer",
             "sync_first", "sync_last")
    variants = []
    for var in problem.variants:
        new = {k: np.concatenate([getattr(var, k), [(1.0 if "mem" in k else 0.6) * max(getattr(var, k)[i], getattr(var, k)[j])
                                                     for i, j, _ in made]]) for k in worst}
        new["mem_capacity"] = np.concatenate([var.mem_capacity, [min(var.mem_capacity[i], var.mem_capacity[j])
                                                                 for i, j, _ in made]])
        new["allowed"] = np.concatenate([var.allowed, [var.allowed[i] and var.allowed[j] for i, j, _ in made]])
        E = G + len(made)
        p2p = np.zeros((E, E))
        src = [*range(G), *(max((opts[i].group, opts[j].group)) for i, j, _ in made)]  # an endpoint's slower group
        p2p[:, :] = var.p2p_time[np.ix_(src, src)]
        p2p[:G, :G] = var.p2p_time
        new["p2p_time"] = p2p
        variants.append(replace(var, **new))
    return replace(problem, options=tuple(opts + [o for *_, o in made]), variants=tuple(variants))


@pytest.mark.parametrize("blocking,budget", [(False, False), (True, False), (False, True)])
def test_node_bounds_hold_with_mixed_endpoints_and_island_cases(blocking, budget, monkeypatch):
    """Eqs. N4-N6 with options at their own p2p endpoints (mixed stages, eq. H5): the stage DP's state is the
    endpoint, so every bound (Lagrangian, one group's GPUs in the state, the islands' case split with the groups
    as blocks) stays at or below the brute-force optimum, and every path offered as a plan is valid. With
    blocking sends (eq. T2b, links scaled x20 so that it binds) the layer bounds carry the cheapest links (X1b).
    With a budget row (eq. W1, weights GPUs x a price per group, the limit 60 % of the least-constrained optimum's
    use) the multipliers price it too."""
    from dataclasses import replace

    from haap_milp.solvers.common.capacity_dp import island_bound

    monkeypatch.setattr(stage_dp, "MAX_STEPS", 20)
    rng = np.random.default_rng(11)
    checked = mixed_used = lifted = 0
    for seed in range(30):
        base = random_problem(seed, uniform=False, same_tp_first_last=False)
        problem = _with_mixed(base, rng)
        if problem is None:
            continue
        if blocking:
            problem = replace(problem, p2p_blocking=True, variants=tuple(
                replace(v, p2p_time=np.asarray(v.p2p_time) * 20.0) for v in problem.variants))
        if budget:
            problem = with_binding_budget(problem, rng, EXACT)
            if problem is None:
                continue
        brute = get_solver("brute")(problem, EXACT)
        if brute.status == "INFEASIBLE":
            continue
        checked += 1
        mixed_used += any(problem.options[s.option].mix for s in brute.assignment.stages)
        blocks = np.arange(len(problem.groups))  # each group its own block: a valid partition
        for v in range(len(problem.variants)):
            t0 = build_tables(problem, v)
            vb = variant_bound(problem, t0)
            if not math.isfinite(vb.total_s):
                continue
            bot, top = vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01
            edges = np.sort(np.concatenate([[bot, top], rng.uniform(bot, top, 2)]))
            lbs = []
            for a, b in itertools.pairwise(edges):
                t = build_tables(problem, v, float(b))
                if t.p_min == 0:
                    continue
                dp = PathDP(problem, t, float(b), t.p_min, t.p_max)
                nb = node_bound(problem, t, float(a), float(b), t.p_min, t.p_max, None, None, dp)
                cb, plan = capacity_bound(problem, dp, float(a), nb.mu, int(rng.integers(0, len(problem.groups))))
                ends = np.full(dp.E, -1)
                for r, e in enumerate(dp.row_group):
                    own = dp.row_usage[r, :dp.G] > 0
                    ends[e] = int(np.flatnonzero(own)[0]) if own.sum() == 1 else -2
                ib, fits = island_bound(problem, dp, float(a), blocks[np.maximum(ends, 0)], nb.mu) if (ends != -2).all() \
                    else (-math.inf, [])
                lbs.append(max(nb.bound_s, cb, ib))
                for p in (nb.plan, plan, *fits):
                    assert p is None or violations(problem, p) == []
            if lbs and v == brute.assignment.variant:
                assert min(lbs) <= brute.objective_s * (1 + 1e-9) + 1e-12, (seed, v, min(lbs), brute.objective_s)
        if budget:  # not vacuous: at the optimum's own period the budget's multiplier lifts the bound
            a = brute.assignment
            tau = _steady(problem, a)
            t = build_tables(problem, a.variant, tau)
            with_b = node_bound(problem, t, tau, tau, t.p_min, t.p_max, None).bound_s
            without = node_bound(replace(problem, budget=None), t, tau, tau, t.p_min, t.p_max, None).bound_s
            lifted += with_b > without * (1 + 1e-6)
    # x20 links or a budget: the mixed options go unused
    assert checked >= 10 and (blocking or budget or mixed_used >= 1), (checked, mixed_used)
    assert not budget or lifted >= 2, lifted


def _node_plans(problem, v: int):
    """Every feasible plan of variant v as (P, tau, T, assignment): the node-level oracle of eqs. N7, N8."""
    from haap_milp.problem import Assignment, Stage, evaluate

    L, var = problem.num_layers, problem.variants[v]
    opts = np.flatnonzero(var.allowed).tolist()
    out = []
    for P in range(1, min(problem.max_stages, L) + 1):
        for cuts in itertools.combinations(range(1, L), P - 1):
            sizes = np.diff([0, *cuts, L]).tolist()
            for combo in itertools.product(opts, repeat=P):
                a = Assignment(v, tuple(Stage(int(o), int(n)) for o, n in zip(combo, sizes)))
                if not violations(problem, a):
                    out.append((P, _steady(problem, a), evaluate(problem, a), a))
    return out


def _sync_heavy(problem, factor: float):
    """``problem`` with every DP sync x ``factor`` (MoE-like: sigma, eq. T3, is then a large part of T)."""
    from dataclasses import replace

    keys = ("sync_fixed", "sync_per_layer", "sync_first", "sync_last")
    return replace(problem, variants=tuple(replace(v, **{k: np.asarray(getattr(v, k)) * factor for k in keys})
                                           for v in problem.variants))


@pytest.mark.parametrize("blocking", [False, True])
def test_sigma_and_inflight_bounds_hold_per_node_and_bind(blocking, monkeypatch):
    """Eqs. N7 (in-flight rows as multipliers) and N8 (sigma's later rows by cases on its bottleneck, per stage count)
    against a node-level oracle: every plan of the variant enumerated, the node's optimum the least T among the plans
    with tau in [a, b] and P in [P_lo, P_hi]. Neither bound may exceed it (eq. N8 may not claim a cutoff above it), the
    paths eq. N8 offers are plans, and eq. N8 lifts the bound above eq. N4's on a good share of the nodes (syncs
    scaled x20-x60 so that sigma's later rows bind, as on MoE). Under blocking sends beta = 0 (eq. T3)."""
    from dataclasses import replace

    from haap_milp.pipeline import sync_share

    monkeypatch.setattr(stage_dp, "NU_STEPS", 40)  # eq. N7 on (off by default): its bound must hold too
    rng = np.random.default_rng(5)
    checked = lifted = split = 0
    for seed in range(40):
        base = random_problem(seed, uniform=False, same_tp_first_last=False, num_layers=int(rng.integers(4, 7)),
                              max_stages=int(rng.integers(2, 4)), max_options=5, num_variants=1)
        problem = _sync_heavy(base, float(rng.uniform(20, 60)))
        if blocking:
            problem = replace(problem, p2p_blocking=True)
        plans = _node_plans(problem, 0)
        if not plans:
            continue
        t0 = build_tables(problem, 0)
        vb = variant_bound(problem, t0)
        bot, top = vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01
        edges = np.sort(np.concatenate([[bot, top], rng.uniform(bot, top, 3)]))
        best = min(plans, key=lambda x: x[2])  # and a narrow node around the optimum's own period and stage count
        for a, b, around in [(*ab, False) for ab in itertools.pairwise(edges)] + [(best[1] * 0.999, best[1] * 1.001, True)]:
            t = build_tables(problem, 0, float(b))
            if t.p_min == 0:
                continue
            plo = best[0] if around else int(rng.integers(t.p_min, t.p_max + 1))
            phi = best[0] if around else int(rng.integers(plo, t.p_max + 1))
            t.p_min, t.p_max = plo, phi
            inside = [T for P, tau, T, _ in plans if plo <= P <= phi and a * (1 - 1e-12) <= tau <= b * (1 + 1e-9)]
            opt = min(inside, default=math.inf)
            dp = PathDP(problem, t, float(b), plo, phi)
            nb = node_bound(problem, t, float(a), float(b), plo, phi, None, None, dp)
            assert nb.bound_s <= opt * (1 + 1e-9) + 1e-12, (seed, a, b, nb.bound_s, opt)
            if not math.isfinite(opt) or not math.isfinite(nb.bound_s):
                continue
            checked += around
            # eqs. N6, N9, N10: the capacity DPs with the in-flight cut, the islands' cases (each group its own block)
            ends = np.full(dp.E, -1)
            ends[dp.row_group] = [int(np.flatnonzero(u)[0]) for u in dp.row_usage[:, :dp.G] > 0]
            ib, fits = capacity_dp.island_bound(problem, dp, float(a), ends, nb.mu)
            cb, plan = capacity_bound(problem, dp, float(a), np.zeros_like(nb.mu), int(rng.integers(0, dp.G)))
            assert max(ib, cb) <= opt * (1 + 1e-9) + 1e-12, (seed, a, b, ib, cb, opt)
            parts = capacity_dp.island_parts(replace(problem, groups=tuple(f"g@{i}" for i in range(dp.G))), dp)
            if parts is not None:  # no usable link between groups: the least over the parts' own bounds
                part_lb = min(node_bound(problem, t, float(a), float(b), plo, phi, None, None,
                                         PathDP(problem, t, float(b), plo, phi, m)).bound_s for m in parts)
                assert part_lb <= opt * (1 + 1e-9) + 1e-12, (seed, a, b, part_lb, opt)
                split += 1
            for p in (plan, *fits):
                assert p is None or violations(problem, p) == []
            found: list = []
            cut = opt * (1 + 1e-7) + 1e-12  # a node holding a plan below the cutoff must not be pruned
            assert sigma_dp.sigma_bound(dp, float(a), nb.mu, cut, sync_share(blocking), found) < cut, (seed, a, b)
            for p in found:
                assert violations(problem, p) == []
            mid = nb.bound_s + 0.5 * (opt - nb.bound_s)  # not vacuous: proven above eq. N4's bound
            if around and opt > nb.bound_s * (1 + 1e-4) and sigma_dp.sigma_bound(dp, float(a), nb.mu, mid,
                                                                                 sync_share(blocking)) >= mid:
                lifted += 1
    # (lifted: 7 of 36 with blocking sends before eq. B2c raised the variants' tau_lb, which moves the sampled
    # nodes; 6 of 36 since)
    assert checked >= 30 and lifted >= checked // 6, (checked, lifted, split)


def test_sigma_bound_holds_and_binds_on_interleaved_variants(monkeypatch):
    """Eq. N8 under interleaving (eq. I1: sigma_v = max_j (s_j - (beta / vpp) sum_{k<j} t_k); the stage DP's costs are
    t / vpp per stage and vpp * c per link, so its credits are (beta / vpp) times the earlier stages' times) against the
    node-level oracle: on the interleaved copies (vpp 2, 3; P fixed, eq. I5) of sync-heavy random problems, eq. N8 never
    claims a cut-off above a node's least plan, the paths it offers are plans, and it lifts eq. N4's bound on some
    nodes around the optimum (7 of 48 here). The test fails with the credit removed (sigma_v = max_j s_j)."""
    from dataclasses import replace

    from haap_milp.pipeline import sync_share

    monkeypatch.setattr(sigma_dp, "INTERLEAVED", True)  # eq. N8b (off by default): its bound must hold
    rng = np.random.default_rng(11)
    checked = lifted = 0
    for seed in range(60):
        base = random_problem(seed, uniform=False, same_tp_first_last=False, num_layers=int(rng.integers(5, 8)),
                              max_stages=int(rng.integers(3, 5)), max_options=4, num_variants=1)
        base = _sync_heavy(base, float(rng.uniform(20, 60)))
        copies = any_interleaved_copies(base.variants, (2, 3), base.max_stages, base.num_layers)
        if not copies:
            continue
        problem = replace(base, variants=tuple(copies))
        for v in range(len(copies)):
            plans = _node_plans(problem, v)
            if not plans:
                continue
            best = min(plans, key=lambda x: x[2])
            for a, b in ((best[1] * 0.999, best[1] * 1.001), (best[1] * 0.98, best[1] * 1.05)):
                t = build_tables(problem, v, float(b))
                if t.p_min == 0:
                    continue
                inside = [T for P, tau, T, _ in plans if a * (1 - 1e-12) <= tau <= b * (1 + 1e-9)]
                opt = min(inside, default=math.inf)
                dp = PathDP(problem, t, float(b), t.p_min, t.p_max)
                nb = node_bound(problem, t, float(a), float(b), t.p_min, t.p_max, None, None, dp)
                if not math.isfinite(opt) or not math.isfinite(nb.bound_s):
                    continue
                assert nb.bound_s <= opt * (1 + 1e-9) + 1e-12, (seed, v, a, b, nb.bound_s, opt)
                checked += 1
                found: list = []
                cut = opt * (1 + 1e-7) + 1e-12  # a node holding a plan below the cutoff must not be pruned
                assert sigma_dp.sigma_bound(dp, float(a), nb.mu, cut, sync_share(False), found) < cut, (seed, v, a, b)
                for p in found:
                    assert violations(problem, p) == []
                mid = nb.bound_s + 0.5 * (opt - nb.bound_s)
                if opt > nb.bound_s * (1 + 1e-4) and sigma_dp.sigma_bound(dp, float(a), nb.mu, mid,
                                                                          sync_share(False)) >= mid:
                    lifted += 1
    assert checked >= 30 and lifted >= 5, (checked, lifted)


def test_slot_blocks_give_the_tables_slot_by_slot(monkeypatch):
    """Eq. N4c: the stage tables built many slots at a time (``SLOT_BLOCK``), and the non-first ones kept for
    ``_base``'s callers, are bit for bit those built one slot at a time without the cache, with and without a
    signature mask; the kept arrays are read-only (a caller writing into a shared table fails loudly)."""
    from haap_milp.solvers.common import stage_dp
    from haap_milp.solvers.common.slot_bounds import build_tables

    checked = 0
    for seed in range(40):
        p = random_problem(seed)
        for v in range(len(p.variants)):
            t = build_tables(p, v)
            if t.n == 0 or t.p_min == 0:
                continue
            for keep in (None, np.arange(t.n) % 2 == 0):
                big = stage_dp.PathDP(p, t, 0.2, t.p_min, t.p_max, keep)
                with monkeypatch.context() as m:
                    m.setattr(stage_dp, "SLOT_BLOCK", 1)
                    m.setattr(stage_dp, "BASE_CACHE", 0)
                    one = stage_dp.PathDP(p, t, 0.2, t.p_min, t.p_max, keep)
                assert not one._nf_base and (big._nf_base or big.k_max <= 1)
                for k in big.first:
                    assert all(np.array_equal(x, y) for x, y in zip(big.first[k], one.first[k]))
                    assert all(np.array_equal(x, y) for x, y in zip(big._first_parts[k], one._first_parts[k]))
                for k in big.nonfirst:
                    assert all(np.array_equal(x, y) for x, y in zip(big.nonfirst[k], one.nonfirst[k]))
                    assert np.array_equal(big._base(k, False), one._base(k, False))
                    assert not big._base(k, False).flags.writeable or k not in big._nf_base
                checked += 1
    assert checked >= 40, checked


def test_pair_window_cut_keeps_every_link_of_every_plan_within_the_node():
    """Eq. N29 against brute force: on random problems whose links between groups cost three mean layers, at a cap b
    between each variant's tau bound and its worst period, every plan whose tau (eq. T2, windows included) is within b
    takes only links ``pair_window_usable`` keeps; and the cut removes some link a plain c/2 <= b test keeps (it fails
    with the cut's stage times dropped, 2b - c >= 0)."""
    from synthetic import feasible_plans

    from haap_milp.problem import boundary_times
    from haap_milp.solvers.common.stage_dp import link_usable, pair_window_usable

    checked = removed = 0
    for seed, problem, v, _, nodes in _slow_link_nodes(range(30), 3.0, (0.05, 0.3)):
        for b, t in nodes:
            ok = pair_window_usable(t, b, t.p_max)
            removed += int((link_usable(t.p2p, b) & ~ok).sum())
            for a in feasible_plans(problem, [v], t.p_max):
                if _steady(problem, a) > b * (1 + 1e-9):
                    continue
                ends = [problem.options[s.option].endpoint for s in a.stages]
                for (e, f), c in zip(itertools.pairwise(ends), boundary_times(problem, a)):
                    assert ok[e, f], (seed, v, b, e, f, c)
                checked += 1
    assert checked >= 200 and removed >= 5, (checked, removed)


def _slow_link_nodes(seeds, layers: float, shares, sync_heavy: bool = False):
    """Per random problem (links between groups at least ``layers`` mean layer times, ``replace_p2p``; with
    ``sync_heavy`` the odd seeds' syncs x 30) and variant with a finite bound: (seed, problem, v, the variant's node
    PathDP, [(b, tables)]) with each cap b a ``share`` of the way from the variant's tau bound to its worst period
    (caps whose tables hold no pipeline left out)."""
    from synthetic import variant_nodes

    for seed in seeds:
        problem = replace_p2p(random_problem(seed, uniform=False, same_tp_first_last=False), layers)
        if sync_heavy and seed % 2:
            problem = _sync_heavy(problem, 30.0)  # (the first stage's cap is on its time, its sync apart)
        for v, dp0, lb in variant_nodes(problem):
            caps = []
            for share in shares:
                b = float(lb + share * (_worst_tau(dp0.t) - lb))
                t = build_tables(problem, v, b)
                if t.p_min:
                    caps.append((b, t))
            yield seed, problem, v, dp0, caps


def _path_cost(dp: PathDP, stages, mu) -> float:
    """The DP's Lagrangian cost of a path of local (option, layers) in pipeline order: its stage costs at their slots
    (the first stage's sync included; inf where the node's tables forbid a stage), links and priced rows."""
    P, total, prev = len(stages), 0.0, None
    for j, (i, n) in enumerate(stages):
        total += float(dp._base(P - j, j == 0)[i, n]) + float(dp.usage[i] @ mu)
        e = int(dp.t.group[i])
        if prev is not None:
            total += float(dp.link[prev, e])
        prev = e
    return total


def test_sender_cap_keeps_the_bound_below_every_plan_within_the_node(monkeypatch):
    """Eq. N29b against brute force: on random problems whose links between groups cost three mean layers, at caps b
    between each variant's tau bound and its worst period, the DP with the sender cap (a stage sending over a link
    takes at most 2b - c - tmin of the receiver) at mu = 0 and at a random mu >= 0 is at most the least Lagrangian path
    cost over the plans whose tau (eq. T2) is within b, its path costs what it claims, and the cap lifts the DP's value
    above the uncapped one on some nodes (it fails when the cap does nothing)."""
    from synthetic import feasible_plans

    from haap_milp.problem import stage_times

    rng = np.random.default_rng(7)
    checked = lifted = 0
    for seed, problem, v, dp0, nodes in _slow_link_nodes(range(60), 3.0, (0.02, 0.05, 0.1, 0.2)):
        plans = [(a, _steady(problem, a)) for a in feasible_plans(problem, [v], dp0.t.p_max)]
        for b, t in nodes:
            dp = PathDP(problem, t, b, t.p_min, t.p_max)
            with monkeypatch.context() as m:
                m.setattr(stage_dp, "SENDER_CAP", False)
                off = PathDP(problem, t, b, t.p_min, t.p_max)
            assert off._slow is None
            local = {int(o): i for i, o in enumerate(t.opts)}
            cap = np.full((dp.E, dp.E), math.inf)
            if dp._slow is not None:
                _, gs, hs, caps = dp._slow
                cap[gs, hs] = caps
            inside = []  # the plans within b, as paths of the node's local options
            for a, tau in plans:
                path = tuple((local.get(s.option, -1), s.num_layers) for s in a.stages)
                if tau > b * (1 + 1e-9) or len(path) > t.p_max or min(i for i, _ in path) < 0:
                    continue
                inside.append(path)
                ends = [int(t.group[i]) for i, _ in path]
                for tj, (e, f) in zip(stage_times(problem, a), itertools.pairwise(ends)):  # the rule itself
                    assert tj <= cap[e, f], (seed, v, b, tj, e, f, cap[e, f])
            scale = stage_dp._mu_scale(t, dp.cap)  # (large prices push the paths across the slow links)
            for mu in (np.zeros(len(dp.cap)), *(rng.uniform(0, f, len(dp.cap)) * scale for f in (3.0, 30.0))):
                res, res0 = dp.run(mu), off.run(mu)
                opt = min((_path_cost(dp, p, mu) for p in inside), default=math.inf)
                if res is None:
                    assert not math.isfinite(opt), (seed, v, b, opt)
                else:
                    assert res.cost <= opt * (1 + 1e-9) + 1e-12, (seed, v, b, res.cost, opt)
                    got = _path_cost(dp, res.stages, mu)
                    assert abs(got - res.cost) <= 1e-9 * max(1.0, abs(res.cost)), (seed, v, b, got, res.cost)
                    assert np.allclose(res.used, dp.usage[[i for i, _ in res.stages]].sum(axis=0))
                    assert res0 is not None and res.cost >= res0.cost * (1 - 1e-12)
                lifted += res0 is not None and (res is None or res.cost > res0.cost * (1 + 1e-9))
                checked += math.isfinite(opt)
    assert checked >= 200 and lifted >= 4, (checked, lifted)


def _capped_paths(dp: PathDP, mu, capped: bool) -> float:
    """The least ``_path_cost`` over every path of the node's tables (stage counts p_first..k_max, every layer split and
    option tuple) whose links are usable and, where ``capped``, whose stage before each slow link (``dp._slow``) takes at
    most the link's cap (its time: a first stage's sync apart)."""
    t, L = dp.t, dp.L
    cap = np.full((dp.E, dp.E), math.inf)
    if capped and dp._slow is not None:
        _, gs, hs, caps = dp._slow
        cap[gs, hs] = caps
    best = math.inf
    for P in range(dp.p_first, dp.k_max + 1):
        times = [dp._base(P - j, j == 0, parts=True)[0] for j in range(P)]
        for cuts in itertools.combinations(range(1, L), P - 1):
            sizes = np.diff([0, *cuts, L]).tolist()
            ok = [np.flatnonzero(np.isfinite(times[j][:, n])).tolist() for j, n in enumerate(sizes)]
            for combo in itertools.product(*ok):
                ends = [int(t.group[i]) for i in combo]
                if all(np.isfinite(dp.link[e, f]) and times[j][combo[j], sizes[j]] <= cap[e, f]
                       for j, (e, f) in enumerate(itertools.pairwise(ends))):
                    best = min(best, _path_cost(dp, list(zip(combo, sizes)), mu))
    return best


def test_sender_cap_dp_is_the_least_table_path_within_the_caps():
    """Eq. N29b's DP is exact for its relaxation: at mu = 0 and at random mu >= 0 its value is the least path cost over
    every path of the node's tables whose stage before each slow link keeps the link's cap (enumerated; half the
    problems with heavy syncs, which the cap leaves out), on nodes with slow links; and that relaxation lies above the
    uncapped one on some of them."""
    rng = np.random.default_rng(11)
    checked = lifted = 0
    for seed, problem, v, _, nodes in _slow_link_nodes(range(40), 2.0, (0.02, 0.05, 0.15, 0.3), sync_heavy=True):
        for b, t in nodes:
            dp = PathDP(problem, t, b, t.p_min, t.p_max)
            if dp._slow is None:
                continue
            _, gs, _, caps = dp._slow
            for k in (k for k in dp.first if k >= 2):  # the capped first stages, option by option
                tm, sy = dp._first_parts[k]
                least, opt = dp._first_capped(k)
                for s, row in itertools.product(range(len(gs)), range(least.shape[1])):
                    of = np.flatnonzero(dp._row_of == dp._slow_rows[s, row])
                    want = np.where(tm[of] <= caps[s], tm[of] + sy[of], math.inf).min(axis=0, initial=math.inf)
                    assert np.array_equal(least[s, row], want), (seed, v, b, k, s, row)
                    fin = np.isfinite(want)
                    pick = opt[s, row][fin]
                    assert np.isin(pick, of).all() and (tm[pick, fin.nonzero()[0]] <= caps[s]).all()
                    assert np.array_equal((tm + sy)[pick, fin.nonzero()[0]], want[fin])
            for mu in (np.zeros(len(dp.cap)), rng.uniform(0, 3, len(dp.cap)) * stage_dp._mu_scale(t, dp.cap)):
                res = dp.run(mu)
                want = _capped_paths(dp, mu, True)
                got = math.inf if res is None else res.cost
                assert got == want or abs(got - want) <= 1e-9 * max(1.0, abs(want)), (seed, v, b, got, want)
                lifted += want > _capped_paths(dp, mu, False) * (1 + 1e-9)
                checked += 1
    assert checked >= 40 and lifted >= 2, (checked, lifted)


def replace_p2p(problem, layers: float):
    """The problem with every link between two groups at least ``layers`` mean layer times (slow links)."""
    from dataclasses import replace

    out = []
    for v in problem.variants:
        p2p = np.asarray(v.p2p_time, float).copy()
        off = ~np.eye(p2p.shape[0], dtype=bool)
        p2p[off] = np.maximum(p2p[off], layers * float(np.mean(v.layer_time)))
        out.append(replace(v, p2p_time=p2p))
    return replace(problem, variants=tuple(out))
