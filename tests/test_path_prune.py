"""Eq. N27 (joint_capacity.least_paths' ``prune``: partial paths that cannot finish below a value are dropped, by a
completion bound priced with the node's multipliers) against the node-level brute-force oracle and the unpruned DP.

Per node and stage count P, with the prune value v at, below and above the node's least plan: the pruned value is the
unpruned one where that lies below v, and otherwise at least min(v, unpruned) -- so it never exceeds the least plan of
P stages -- on eq. N20's joint state (every group, or pooled by type; with sigma's cases, eq. N20b) and on eq. N25's two
crossing cases, on problems with and without a priced budget (eq. W1); the traced plan is the same wherever it lies
below v; the float32 case (eq. N27b) never lies above the float64 one; eq. N27c keeps the floor where it does not run
and every lift where it does; a crossing bound above the cut-off stays above it by more than the node's float margin
(a count pruned at exactly the cut-off left the node open); and the pruning is not vacuous (it ends runs early). The
test fails (checked by mutation) with the twice-or-more case's debt doubled or shifted by one crossing, the free GPUs'
credit left out, the completion doubled, the largest link taken for the least, the twice-or-more case pruned at the
cut-off itself, float32 without its margin, a count eq. N27c skips given the at-most-once value or one it runs for
and finds no path of given the floor, or the budget's column left out of the prices (a crash)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import feasible_plans, random_problem
from test_island_crossings import _instance

from haap_milp.pipeline import sync_share
from haap_milp.problem import Budget, evaluate
from haap_milp.solvers.common import island_crossings, joint_capacity
from haap_milp.solvers.common.bounds import variant_bound
from haap_milp.solvers.common.branch_and_bound import _steady, _worst_tau
from haap_milp.solvers.common.capacity_dp import island_blocks
from haap_milp.solvers.common.island_split import gpu_type
from haap_milp.solvers.common.slot_bounds import build_tables
from haap_milp.solvers.common.stage_dp import PathDP, node_bound

TOL = 1e-9


def _agree(plain: dict, pruned: dict, v: float, least: dict, where, rel: float = 1e-9) -> None:
    """Eq. N27's contract per P: exact below v (within ``rel``: float32 runs), at least min(v, exact) above it, never
    above the least plan."""
    for P, x in pruned.items():
        exact = plain.get(P, math.inf)
        if exact < v * (1 - 1e-7):
            assert abs(x - exact) <= rel * abs(exact), (where, P, x, exact, v)
        else:
            assert x >= min(v, exact) * (1 - rel), (where, P, x, exact, v)
        assert x <= least.get(P, math.inf) * (1 + TOL) + 1e-12, (where, P, x, least.get(P), v)


def _budgeted(p, rng):
    """``p`` with a random per-group price budget (eq. W1) at 20-60 % of the most its stages could spend."""
    price = rng.integers(1, 5, len(p.groups))
    w = np.array([sum(int(price[g]) * n for g, n in o.usage) for o in p.options], np.int64)
    return dataclasses.replace(p, budget=Budget(w, max(1, int(rng.uniform(0.2, 0.6) * int(w.max()) * p.max_stages)),
                                                "test"))


def _node_plans(p, v: int) -> list:
    """Every feasible plan of variant v as (P, tau, T, assignment): the node-level oracle (``test_stage_dp``'s, on
    ``feasible_plans``, which leaves out the plans over a group's GPUs or memory before ``violations``: 9.1 -> 1.9 s
    on this test's problems, the same plans)."""
    return [(len(a.stages), _steady(p, a), evaluate(p, a), a) for a in feasible_plans(p, [v])]


def _nodes(p, v, rng):
    t0 = build_tables(p, v)
    vb = variant_bound(p, t0)
    bot, top = vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01
    return itertools.pairwise(np.sort(np.concatenate([[bot, top], rng.uniform(bot, top, 2)])).tolist())


def _runs(monkeypatch):
    """A counter of the slots each ``least_paths`` run computes (pruned runs end early when no partial path is left)."""
    calls = {"n": 0}
    slot = joint_capacity._slot

    def counted(*args, **kw):
        calls["n"] += 1
        return slot(*args, **kw)

    monkeypatch.setattr(joint_capacity, "_slot", counted)
    return calls


def _check_node(p, dp, a, mu, inside, types, rng, calls) -> tuple[int, int]:
    """(runs checked, runs that computed fewer slots pruned) on one node."""
    least: dict = {}
    for P, T in inside:
        least[P] = min(least.get(P, math.inf), T)
    opt = min(least.values(), default=math.inf)
    blocks = island_blocks(p, dp)
    pooled = joint_capacity._units(dp, joint_capacity.type_blocks(types)) if len(set(types)) < dp.G else None
    states = [u for u in (joint_capacity.joint_units(dp, types), pooled) if u is not None]
    checked = shorter = 0
    for u in states:
        plain_plans: list = []
        n0 = calls["n"]
        plain = joint_capacity.least_paths(dp, a, mu, u, plans=plain_plans)
        full = calls["n"] - n0
        finite = [x for x in plain.values() if math.isfinite(x)]
        if not finite:
            continue
        for v in {opt * (1 + 1e-7), float(np.median(finite)), min(finite) * 0.999, float(rng.uniform(min(finite),
                  max(finite) * 1.01))}:
            if not math.isfinite(v):
                continue
            got: list = []
            n0 = calls["n"]
            pruned = joint_capacity.least_paths(dp, a, mu, u, plans=got, prune=v)
            shorter += calls["n"] - n0 < full
            _agree(plain, pruned, v, least, ("N20", a, v))
            if min(finite) < v * (1 - 1e-7):
                assert [s.stages for s in got] == [s.stages for s in plain_plans], (a, v)
            # eqs. N20/N20b with the incumbent: sigma's cases pruned too, the node's bound never above its least plan
            cut = v / 1.01
            jb, jp = joint_capacity.joint_bound(dp, a, mu, cut, sync_share(p.p2p_blocking), u, incumbent=v)
            assert jb <= opt * (1 + 1e-7) + 1e-12 or opt >= cut, (a, v, jb, opt)
            for P, x in enumerate(jp):
                lp = least.get(P, math.inf)
                assert x <= lp * (1 + 1e-7) + 1e-12 or lp >= cut, (a, v, P, x, lp)
            if blocks is not None and len(u.R) < dp.G:
                cb_plain = island_crossings.crossing_bound(dp, a, mu, u, types, p.group_island, blocks)
                cb = island_crossings.crossing_bound(dp, a, mu, u, types, p.group_island, blocks, cutoff=v,
                                                     incumbent=v * 1.01)
                twice = island_crossings._TwiceOrMore(blocks, u)  # (the case alone: exact below its own values)
                both = island_crossings._with_digit(u, 2)
                alone = joint_capacity.least_paths(dp, a, mu, both, links=twice)
                exact = island_crossings._TwiceOrMore(blocks, u)
                exact.dtype = np.float64  # (eq. N27b: the float32 run, its rounding taken off, stays under float64's)
                for P, x in joint_capacity.least_paths(dp, a, mu, both, links=exact).items():
                    assert alone[P] <= x and (alone[P] >= x * (1 - 1e-5) or not math.isfinite(x)), (P, alone[P], x)
                own = [x for x in alone.values() if math.isfinite(x)]
                for w in {v, *(float(np.quantile(own, q)) * (1 + 1e-6) for q in (0, 0.5))} if own else {v}:
                    _agree(alone, joint_capacity.least_paths(dp, a, mu, both, links=twice, prune=w), w, {},
                           ("twice", a, w), 1e-5)  # (float32, eq. N27b)
                if cb is not None and cb_plain is not None:
                    _agree({P: x for P, x in enumerate(cb_plain) if math.isfinite(x)},
                           {P: x for P, x in enumerate(cb) if dp.p_first <= P <= dp.k_max}, v, least, ("N25", a, v),
                           1e-5)
                    # eq. N27c: with eq. N20's floor the twice-or-more case runs only for the counts it may lift
                    # under the cut-off; the rest keep the floor: still never above a count's least plan
                    floor = np.full(dp.k_max + 1, math.inf)
                    for P, x in plain.items():
                        floor[P] = x
                    cf = island_crossings.crossing_bound(dp, a, mu, u, types, p.group_island, blocks, floor,
                                                         cutoff=v, incumbent=v * 1.01)
                    for P in range(dp.p_first, dp.k_max + 1) if cf is not None else ():
                        assert max(cf[P], floor[P]) <= least.get(P, math.inf) * (1 + TOL) + 1e-12, (a, v, P)
                        if floor[P] >= v:  # (not run for it: it keeps at most the floor)
                            assert cf[P] <= floor[P], (a, v, P, cf[P], floor[P])
                        elif cb[P] > floor[P]:  # (run for it: the lift of the case run for every count is kept)
                            assert cf[P] >= min(cb[P], v) * (1 - 1e-5), (a, v, P, cf[P], cb[P], floor[P])
                    # a count above the cut-off stays above it after the node's float margin (_safe): it closes
                    above = cb_plain >= v * (1 + 2e-6)
                    assert np.all(cb[above] >= v * (1 + 5e-7)), (a, v, cb[above], cb_plain[above])
            checked += 1
    return checked, shorter


def test_pruned_paths_keep_every_value_below_the_prune_and_bound_the_rest(monkeypatch):
    """Random several-group problems (N20's own state, multipliers from eq. N4's node bound) and mirrored two-island
    problems (N20 pooled by type, and N25's cases)."""
    calls = _runs(monkeypatch)
    rng = np.random.default_rng(17)
    checked = shorter = crossed = 0
    problems = [random_problem(seed, uniform=False, same_tp_first_last=False, num_layers=int(rng.integers(4, 7)),
                               max_stages=int(rng.integers(2, 4)), max_options=5, num_variants=1,
                               num_groups=int(rng.integers(2, 4))) for seed in range(20)]
    problems += [_instance(seed, rng) for seed in range(12)]
    problems += [_budgeted(p, rng) for p in problems[::3]]  # (eq. W1 priced: mu_cost > 0, base below tau's term)
    for p in problems:
        types = [gpu_type(g) for g in p.groups]
        for v in range(len(p.variants)):
            plans = _node_plans(p, v)
            if not plans:
                continue
            for a, b in _nodes(p, v, rng):
                t = build_tables(p, v, b)
                if t.p_min == 0:
                    continue
                dp = PathDP(p, t, b, t.p_min, t.p_max)
                nb = node_bound(p, t, a, b, t.p_min, t.p_max, None, None, dp)
                mu = np.asarray(nb.mu, float)[:len(dp.cap)]
                inside = [(P, T) for P, tau, T, _ in plans if a * (1 - 1e-12) <= tau <= b * (1 + 1e-9)]
                c, s = _check_node(p, dp, a, mu, inside, types, rng, calls)
                checked, shorter = checked + c, shorter + s
                crossed += c > 0 and island_blocks(p, dp) is not None and len(set(types)) < dp.G
    assert checked >= 150 and shorter >= 20 and crossed >= 10, (checked, shorter, crossed)
