"""Eq. LS4 (solvers/common/segment_dp.py): the segment DP returns a feasible plan, and it is the least of eq. N4's
right side over every plan of the node whose groups form contiguous segments (brute force on small instances)."""

from __future__ import annotations

import math
import pathlib
import sys
from functools import cache

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import feasible_plans, random_problem, variant_nodes

from haap_milp.problem import Assignment, boundary_times, stage_times, violations
from haap_milp.solvers.common import segment_dp
from haap_milp.solvers.common.stage_dp import PathDP


def _local(dp: PathDP) -> dict:
    """The node's table row of each option it holds."""
    return {int(o): i for i, o in enumerate(dp.t.opts)}


def _surrogate(dp: PathDP, plan: Assignment, local: dict | None = None) -> float:
    """sum of the node's stage costs at their slots (inf where the tables forbid the stage) plus the links
    (``local``: ``_local(dp)``, passed by the loops over every plan of a node)."""
    local = _local(dp) if local is None else local
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


@cache
def _feasible(seed: int, islands: str, same_tp: bool, v: int, P_max: int) -> tuple[tuple[Assignment, bool], ...]:
    """Every feasible plan of variant v of ``_problem(seed, islands, same_tp)`` with up to P_max stages (brute force,
    ``feasible_plans``) and whether it is a segment plan (``_is_segments``), built once for the tests (and
    parametrizations) that share the problem."""
    problem = _problem(seed, islands, same_tp)
    return tuple((a, _is_segments(problem, a)) for a in feasible_plans(problem, [v], P_max))


def _shared_islands(problem):
    """The same problem with its groups on two islands, two or more groups each (names ``type#n@isl{n % 2}``), and
    every link between groups as cheap as the cheapest, so that leaving an island and coming back can pay (the
    island runs are then a real restriction)."""
    from dataclasses import replace

    names = tuple(f"{g.split('@')[0]}#{n}@isl{n % 2}" for n, g in enumerate(problem.groups))
    variants = tuple(replace(v, p2p_time=np.full_like(np.asarray(v.p2p_time), float(np.min(v.p2p_time))))
                     for v in problem.variants)
    return replace(problem, groups=names, variants=variants)


@cache
def _problem(seed: int, islands: str, same_tp: bool):
    """The small random problem of ``seed``: ``own``, each group its own island; ``shared``, four groups on two
    islands (``_shared_islands``). ``same_tp``: eq. U2 on."""
    problem = random_problem(seed, uniform=False, same_tp_first_last=same_tp, num_groups=None if islands == "own" else 4)
    return _shared_islands(problem) if islands == "shared" else problem


def _segment_nodes(seeds, islands: str, same_tp: bool):
    """(seed, problem, variant, node DP) of ``_problem``'s problems where eq. LS4 applies."""
    for seed in seeds:
        problem = _problem(seed, islands, same_tp)
        for v, dp, _ in variant_nodes(problem):
            if segment_dp.applies(dp, problem.group_island):
                yield seed, problem, v, dp


@pytest.mark.parametrize("islands", ["own", "shared"])
def test_segment_dp_is_feasible_and_least_over_segment_plans(islands):
    """``own``: every group its own island (random_problem's names), so any order of group segments; ``shared``:
    four groups on two islands, so the island runs (``segment_dp._step``) bind."""
    checked = found = 0
    for seed, problem, v, dp in _segment_nodes(range(40), islands, same_tp=False):
        t = dp.t
        plan = segment_dp.segment_plan(dp, problem.group_island)
        best, local = math.inf, _local(dp)
        for a, segments in _feasible(seed, islands, False, v, t.p_max):
            if len(a.stages) < t.p_min or not segments:
                continue
            best = min(best, _surrogate(dp, a, local))
        checked += 1
        if plan is None:
            assert math.isinf(best), (seed, v, best)
            continue
        found += 1
        assert violations(problem, plan) == [], (seed, v, plan)
        assert _is_segments(problem, plan)
        assert math.isclose(_surrogate(dp, plan), best, rel_tol=1e-9), (seed, v, _surrogate(dp, plan), best)
    assert checked >= 20 and found >= 10, (checked, found)


def _slow_links(problem):
    """The problem with every link between two groups as slow as a stage of the mean option's layer time x 3 (a
    slow link between islands, where eq. T2's in-flight rows decide where the pipeline crosses)."""
    from dataclasses import replace

    out = []
    for v in problem.variants:
        p2p = np.asarray(v.p2p_time, float).copy()
        off = ~np.eye(p2p.shape[0], dtype=bool)
        p2p[off] = np.maximum(p2p[off], 3 * float(np.mean(v.layer_time)))
        out.append(replace(v, p2p_time=p2p))
    return replace(problem, variants=tuple(out))


def _steady(problem, a) -> float:
    """Eq. T2 without its windows that end before the last stage: max t, max c / 2 and the in-flight rows."""
    t, c = stage_times(problem, a), boundary_times(problem, a)
    m, p = problem.variants[a.variant].num_microbatches, len(t)
    trip = [(sum(t[j:]) + sum(c[j:])) / (p - j) for j in range(p) if p - j < m]
    return max(max(t), max(c, default=0.0) / 2, *trip)


def test_segment_dp_keeps_the_in_flight_rows_under_a_tight_tau_cap():
    """With the node's cap b between the variant's tau bound and its worst period, eq. T2's in-flight rows bind: the
    plan's own tau (eq. T2) stays within b, and it is the least over the segment plans whose tau is within b (the
    DP cuts every state whose slots 1..k exceed k b, eq. N10; before, it returned plans whose in-flight rows broke
    the cap, 7.0 s against 4.69 s on gpt3-13b x 128 H100@ib + 128 A100-80@roce). The rows are those through the
    last stage (windows j..P-1): eq. T2's windows that end earlier are not in the DP's state (its plans are scored by
    ``evaluate``)."""
    from haap_milp.solvers.common.branch_and_bound import _worst_tau
    from haap_milp.solvers.common.slot_bounds import build_tables

    checked = found = binding = 0
    for seed in range(40):
        problem = _slow_links(random_problem(seed, uniform=False, same_tp_first_last=False))
        if problem.p2p_blocking:
            continue
        for v, dp0, lb in variant_nodes(problem):
            b = lb + 0.05 * (_worst_tau(dp0.t) - lb)
            t = build_tables(problem, v, b)
            if t.p_min == 0:
                continue
            dp = PathDP(problem, t, b, t.p_min, t.p_max)
            if not segment_dp.applies(dp, problem.group_island):
                continue
            plan = segment_dp.segment_plan(dp, problem.group_island)
            best, loose, local = math.inf, math.inf, _local(dp)
            for a in feasible_plans(problem, [v], t.p_max):
                if len(a.stages) < t.p_min or not _is_segments(problem, a):
                    continue
                cost = _surrogate(dp, a, local)
                loose = min(loose, cost)
                if _steady(problem, a) <= b * (1 + 1e-9):
                    best = min(best, cost)
            checked += 1
            binding += best > loose * (1 + 1e-9)
            if plan is None:
                assert math.isinf(best), (seed, v, best)
                continue
            found += 1
            assert _steady(problem, plan) <= b * (1 + 1e-9), (seed, v)
            assert math.isclose(_surrogate(dp, plan), best, rel_tol=1e-9), (seed, v, _surrogate(dp, plan), best)
    assert checked >= 20 and found >= 10 and binding >= 3, (checked, found, binding)


def _is_head_plan(problem, plan: Assignment) -> bool:
    """Eq. LS4g's shape: the first stage alone, of a group other than the next stage's, then a segment plan."""
    if len(plan.stages) < 2:
        return False
    g0, g1 = (problem.options[s.option].group for s in plan.stages[:2])
    return g0 != g1 and _is_segments(problem, Assignment(plan.variant, plan.stages[1:]))


def _head_sizes(dp: PathDP, p: int) -> dict:
    """Per group, (unit weights, rows, the head sizes eq. LS4g tries at tp p)."""
    ends = segment_dp._ends_of_tp(dp, p)
    rows_of = segment_dp._own_rows(dp)
    tried = segment_dp.head_sizes(ends, rows_of)
    return {g: (segment_dp._units_up(dp.row_usage[rows_of[g], g].astype(np.int64), int(dp.cap[g]))[0], rows_of[g],
                sizes) for g, sizes in tried.items()}


def _head_units(dp: PathDP, problem, plan: Assignment, sizes: dict) -> int | None:
    """The head's units as eq. LS4g counts them (None: its option's footprint is not one of the group's rows)."""
    local = {int(o): i for i, o in enumerate(dp.t.opts)}
    i = local[plan.stages[0].option]
    g = int(dp.t.group[i])
    w, rows, _ = sizes[g]
    foot = np.r_[dp.t.group[i], dp.usage[i]]
    for r, wv in zip(rows, w):
        if np.array_equal(np.r_[dp.row_group[r], dp.row_usage[r]], foot):
            return int(wv)
    return None


@pytest.mark.parametrize("islands", ["own", "shared"])
def test_same_tp_plans_are_feasible_and_least_over_their_shapes(islands):
    """Eq. LS4g under eq. U2 (first and last stage of one tp): every plan is feasible (eq. U2 included), and the best
    of them is the least of eq. N4's right side over the union of (a) the segment plans that keep eq. U2 and (b) the
    head plans (first stage alone of another group than the next stage's, the rest a segment plan, the group's
    GPUs shared) whose head has one of the sizes tried at its tp (brute force on small instances; both shapes occur
    among the winners). ``islands`` as in the first test: with ``shared`` a head may also leave an island and come
    back."""
    checked = heads = 0
    for seed, problem, v, dp in _segment_nodes(range(60), islands, same_tp=True):
        plans = [a for a in segment_dp.same_tp_plans(dp, problem.group_island) if a is not None]
        for a in plans:
            assert violations(problem, a) == [], (seed, v, a)
        got = min((_surrogate(dp, a) for a in plans), default=math.inf)
        sizes = {p: _head_sizes(dp, p) for p in np.unique(dp.t.tp).tolist()}
        best, best_head, local = math.inf, math.inf, _local(dp)
        for a, segments in _feasible(seed, islands, True, v, dp.t.p_max):
            if len(a.stages) < dp.t.p_min:
                continue
            if segments:
                best = min(best, _surrogate(dp, a, local))
            elif _is_head_plan(problem, a):
                p = problem.options[a.stages[0].option].tp
                g = problem.options[a.stages[0].option].group
                if g in sizes[p] and _head_units(dp, problem, a, sizes[p]) in sizes[p][g][2]:
                    best_head = min(best_head, _surrogate(dp, a, local))
        checked += 1
        heads += best_head < best * (1 - 1e-9)
        assert math.isclose(got, min(best, best_head), rel_tol=1e-9) or got == min(best, best_head), \
            (seed, v, got, best, best_head)
    assert checked >= 20 and heads >= (1 if islands == "own" else 3), (checked, heads)


def _sync_cap(problem, plans) -> float:
    """A cap between the node's non-first stage syncs over the plans given: halfway between the two middle ones of
    their distinct values (no sync lies on it, so float noise cannot decide a comparison)."""
    from haap_milp.problem import sync_times

    vals = sorted({round(x, 12) for a in plans for x in sync_times(problem, a)[1:]})
    m = len(vals) // 2
    return (vals[m - 1] + vals[m]) / 2 if len(vals) >= 2 else math.inf


def _capped_surrogate(dp: PathDP, problem, plan: Assignment, cap: float, local: dict | None = None) -> float:
    """``_surrogate`` with the first stage's sync priced as max(s_0, cap) (eq. LS4h)."""
    local = _local(dp) if local is None else local
    first = plan.stages[0]
    s0 = float(dp._base(len(plan.stages), True, parts=True)[1][local[first.option], first.num_layers])
    return _surrogate(dp, plan, local) - s0 + max(s0, cap)


def _within(problem, dp: PathDP, a: Assignment, cap: float, per: float) -> bool:
    """Every stage j > 0 of ``a`` syncs within cap + per (P - k), k its slot from the end, P the node's least count."""
    from haap_milp.problem import sync_times

    s, n = sync_times(problem, a), len(a.stages)
    return all(s[j] <= cap + per * max(dp.p_first - (n - j), 0) for j in range(1, n))


@pytest.mark.parametrize("islands", ["own", "shared"])
@pytest.mark.parametrize("per_stage", [0.0, 0.3])
def test_sync_capped_is_least_over_segment_plans_within_the_cap(islands, per_stage):
    """Eq. LS4h (``segment_dp.sync_capped``): with the cap c and the allowance a per earlier stage, the segment DP's
    plan is the least over the segment plans whose stage j > 0 syncs within c + a (P - k) (k = P_j's slot from the
    end, P the node's least stage count; ``problem.sync_times``, the evaluator's own sums: brute force) of eq. N4's
    right side with the first stage's sync priced as max(s_0, c). The cap binds on some nodes (the least within it is
    dearer than the least overall), so a cap left out, or applied to the wrong terms, fails. ``per_stage``: a, in
    units of the node's least non-zero sync."""
    from haap_milp.problem import sync_times

    checked = binding = 0
    for seed, problem, v, dp in _segment_nodes(range(40), islands, same_tp=False):
        seg = [a for a, segments in _feasible(seed, islands, False, v, dp.t.p_max)
               if len(a.stages) >= dp.t.p_min and segments]
        cap = _sync_cap(problem, seg)
        syncs = [x for a in seg for x in sync_times(problem, a) if x > 0]
        per = per_stage * min(syncs, default=0.0)
        local = _local(dp)
        cost = [_capped_surrogate(dp, problem, a, cap, local) for a in seg]
        best = min((c for a, c in zip(seg, cost) if _within(problem, dp, a, cap, per)), default=math.inf)
        plan = segment_dp.segment_plan(segment_dp.sync_capped(dp, cap, per), problem.group_island)
        checked += 1
        binding += best > min(cost, default=math.inf) * (1 + 1e-9)
        if plan is None:
            assert math.isinf(best), (seed, v, best)
            continue
        assert violations(problem, plan) == [], (seed, v, plan)
        assert _within(problem, dp, plan, cap, per), (seed, v)
        got = _capped_surrogate(dp, problem, plan, cap)
        assert math.isclose(got, best, rel_tol=1e-9), (seed, v, got, best)
    assert checked >= 20 and binding >= 3, (checked, binding)


def _row_units(dp: PathDP, g: int, option: int) -> int | None:
    """The units (``segment_dp._units_up``) of ``option``'s footprint among group g's own rows (None: not one)."""
    rows = segment_dp._own_rows(dp)[g]
    w = segment_dp._units_up(dp.row_usage[rows, g].astype(np.int64), int(dp.cap[g]))[0]
    i = _local(dp).get(option)
    if i is None:
        return None
    foot = np.r_[dp.t.group[i], dp.usage[i]]
    return next((int(wv) for r, wv in zip(rows, w) if np.array_equal(np.r_[dp.row_group[r], dp.row_usage[r]], foot)),
                None)


def _is_tail_plan(problem, dp: PathDP, plan: Assignment, g: int, wv: int) -> bool:
    """Eq. LS4j's shape for the tail (g, wv): the last stage of group g and wv units after a stage of another group;
    the stages before it a segment plan that, where the tail's island differs from the stage before it, holds no
    stage on the tail's island (the pipeline enters each island once, ``segment_dp._step``)."""
    group = [problem.options[s.option].group for s in plan.stages]
    island = problem.group_island
    if len(plan.stages) < 2 or group[-1] != g or group[-2] == g:
        return False
    if _row_units(dp, g, plan.stages[-1].option) != wv:
        return False
    head = Assignment(plan.variant, plan.stages[:-1])
    return _is_segments(problem, head) and (island[group[-2]] == island[g]
                                            or all(island[h] != island[g] for h in group[:-1]))


@pytest.mark.parametrize("islands", ["own", "shared"])
def test_tail_plans_are_feasible_and_least_over_their_shape(islands):
    """Eq. LS4j (``segment_plan``'s ``tail``): for each (group, units) ``tail_sizes`` offers, the plan is feasible and
    the least of eq. N4's right side over the plans of ``_is_tail_plan``'s shape (brute force): the tail's group may
    come again as an earlier segment of its own, within its GPUs (on one island, ``shared``: some of the plans found
    do), so a tail that were only a segment plan's last stage, or that let its group's stages overdraw its GPUs,
    would fail. ``test_tail_plan_by_hand`` shows the shape paying."""
    checked = twice = 0
    for seed, problem, v, dp in _segment_nodes(range(24), islands, same_tp=False):
        t, local = dp.t, _local(dp)
        feasible = [a for a, _ in _feasible(seed, islands, False, v, t.p_max) if len(a.stages) >= t.p_min]
        for g, wv in segment_dp.tail_sizes(dp, []):
            plan = segment_dp.segment_plan(dp, problem.group_island, tail=(g, wv))
            best = min((_surrogate(dp, a, local) for a in feasible if _is_tail_plan(problem, dp, a, g, wv)),
                       default=math.inf)
            checked += 1
            if plan is None:
                assert math.isinf(best), (seed, v, g, wv, best)
                continue
            assert violations(problem, plan) == [], (seed, v, g, wv, plan)
            assert math.isclose(_surrogate(dp, plan), best, rel_tol=1e-9), (seed, v, g, wv, _surrogate(dp, plan), best)
            twice += sum(problem.options[s.option].group == g for s in plan.stages) > 1
    assert checked >= 80 and twice >= (0 if islands == "own" else 10), (checked, twice)  # (measured: 125 + 156 pairs; 0 + 17)


def test_tail_plan_by_hand():
    """Eq. LS4j by hand: 3 layers of one layer a stage (memory) on 2 GPUs of group a and 1 of group b, one island; a
    stage of b pays 10 s more as the first or the last stage (its embedding or output layer). The segment plans put b
    at an end ([a, a, b] or [b, a, a]: an 11 s stage, T = 3 x 11 + 13 = 46 s); the tail plan [a, b, a] keeps it
    inside: T = 3 x 1 + 3 = 6 s, the best plan (brute force)."""
    from synthetic import feasible_plans

    from haap_milp.problem import Option, Problem, Variant, evaluate

    zero = {k: np.zeros(2) for k in ("first_time", "last_time", "layer_static_mem", "layer_act_mem", "first_static_mem",
                                     "first_act_mem", "last_static_mem", "last_act_mem", "fixed_mem", "sync_fixed",
                                     "sync_per_layer", "sync_first", "sync_last")}
    zero.update(first_time=np.array([0.0, 10.0]), last_time=np.array([0.0, 10.0]), layer_static_mem=np.ones(2),
                mem_capacity=np.full(2, 1.5))
    var = Variant(samples_per_microbatch=1, num_microbatches=4, layer_time=np.ones(2), p2p_time=np.zeros((2, 2)),
                  allowed=np.ones(2, bool), **zero)
    problem = Problem(num_layers=3, max_stages=3, groups=("a@main", "b@main"), group_capacity=(2, 1),
                      options=(Option(0, 1, 1, 1, "none"), Option(1, 1, 1, 1, "none")), variants=(var,))
    (_, dp, _), = variant_nodes(problem)
    plain = segment_dp.segment_plan(dp, problem.group_island)
    (g, wv), = [pair for pair in segment_dp.tail_sizes(dp, [0]) if pair[0] == 0]
    tail = segment_dp.segment_plan(dp, problem.group_island, tail=(g, wv))
    assert [problem.options[s.option].group for s in tail.stages] == [0, 1, 0]
    assert violations(problem, tail) == []
    assert evaluate(problem, plain) == pytest.approx(46.0) and evaluate(problem, tail) == pytest.approx(6.0)
    assert evaluate(problem, tail) == pytest.approx(min(evaluate(problem, a) for a in feasible_plans(problem)))
