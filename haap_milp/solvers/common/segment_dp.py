"""Eq. LS4: plans made of one contiguous segment per GPU group, stage sizes free, by an exact DP per node.

The DP heuristic (dp.md, DP3) gives each group's segment one stage size; the optima of three-type clusters mix
sizes inside a segment (llama3-70b on 344 H100 + 344 A100-80 + 336 A100-40, optimum 13.626 s: H100 stages of 8,
16, 32 and 64 GPUs, then A100-40 and A100-80 stages of 64 and 128; the DP heuristic's 14.714 s, and the search
found it only after 59 s). Here, on a node (variant, tau in [a, b], stage counts), the least of eq. N4's right side

    (M - 1) a + sum_j t_j + sum_j c_j + s_0

over the pipelines whose groups form contiguous segments (each group at most one, in any order), with each
group's GPUs in the state: slots k = 1 .. K from the end, state (groups placed so far, the group of slot k, layers
held, units of that group used; units as eq. N5's, ``capacity_dp._units``, with q exact or the state's rounding,
which the final check catches). The slot tables are the node's (memory at the exact slot, eqs. M2, D1, X1), links
between endpoints exact, and the in-flight rows of eq. T2 kept within the node's b by eq. N10's cut (eq. LS4a: F at
slot k is the least time and links of slots 1..k, which row k < M bounds by k b). Every path found is checked
(``violations``) and scored (``evaluate``) by the caller before it is offered, so this is a heuristic: it claims no
bound. Cost: one capacity DP per (set, group) state.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from functools import reduce

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from haap_milp.problem import Assignment, Stage
from haap_milp.solvers.common.stage_dp import INF, PathDP, inflight_cap, sync_parts

RMAX = 96  # most units per group in the state
PRUNE_RTOL = 1e-9  # a later part is dropped once its least end lies this share above the best (float sums' slack)
MAX_GROUPS = 4  # groups per island: (set, group) states grow as G 2^(G-1) per island
HEAD_SIZES = 2  # eq. LS4g: a head of each group's smallest first-stage sizes (in units) only


def _own_rows(dp: PathDP) -> list[np.ndarray]:
    """Per group, the footprint rows that draw from it alone at its own endpoint (mixed stages, eq. H1, are left
    out: a heuristic may search a subset)."""
    use = dp.row_usage[:, :dp.G] > 0
    single = use.sum(axis=1) == 1
    owner = np.argmax(use, axis=1)
    return [np.flatnonzero(single & (owner == g) & (dp.row_group == g)) for g in range(dp.G)]


def applies(dp: PathDP, island: np.ndarray) -> bool:
    """At least two groups with stages of their own, and at most MAX_GROUPS groups on any island (``island`` [G]:
    each group's island, ``Problem.group_island``)."""
    return np.bincount(island, minlength=1).max() <= MAX_GROUPS and sum(len(r) > 0 for r in _own_rows(dp)) >= 2


def segment_plan(dp: PathDP, island: np.ndarray, head: tuple[int, int] | None = None,
                 stop: float = math.inf, tail: tuple[int, int] | None = None) -> Assignment | None:
    """The least path of contiguous group segments over the node (None: none), as a plan; the groups of an island
    form one run of segments (the pipeline enters each island once), so the state keeps the groups placed on the
    current island and the islands left behind: ``_step``. ``head`` = (g, wv): eq. LS4g's plans instead, whose first
    stage alone is a second segment of group g, of wv units (``_close_head``); ``tail`` = (g, wv): eq. LS4j's, whose
    last stage alone is one (``_tail_start``). ``stop`` (``time.perf_counter``): past it, between slots, the run ends
    with no plan (eq. LS4i; a heuristic: None proves nothing)."""
    G, K = dp.G, dp.k_max
    rows_of = _own_rows(dp)
    unit = []
    for g in range(G):
        w, R = np.zeros(0, np.int64), 0
        if len(rows_of[g]):
            w, R = _units_up(dp.row_usage[rows_of[g], g].astype(np.int64), int(dp.cap[g]))
        unit.append((w, R))
    if head is not None:  # (the head's units are set aside: the later stages of g share the rest)
        g_head, w_head = head
        head_w = unit[g_head][0]
        unit[g_head] = (head_w, unit[g_head][1] - w_head)
        if unit[g_head][1] < 0:
            return None
    if tail is not None:  # (likewise the tail's: a later segment of g shares the rest)
        tail_w = unit[tail[0]][0]
        unit[tail[0]] = (tail_w, unit[tail[0]][1] - tail[1])
        if unit[tail[0]][1] < 0 or not (tail_w == tail[1]).any():
            return None
    states: dict = {}  # (mask, g) -> F [L+1, R_g+1]: the least later part with slot k at group g
    trace = []  # per non-first slot: (mask, g) -> (src [L+1, R+1], candidates)
    best = (INF, None)
    pure = dp.t.vpp <= 1 and not dp.extra_priced and math.isfinite(dp.b)  # (costs are times and links alone)
    # times and links: the L - l layers left cost at least L - l times the least layer time (every stage's fixed terms
    # and links are >= 0)
    least = float(dp.t.coef["layer_time"].min(initial=INF)) if pure else INF
    floor = (dp.L - np.arange(dp.L + 1)) * (least if math.isfinite(least) and least > 0 else 0.0)
    for k in range(1, K + 1):
        if time.perf_counter() > stop:
            return None
        if k >= dp.p_first and k in dp.first and not (tail is not None and k == 1):  # (a tail needs a stage before)
            cap = inflight_cap(k, dp.b) if pure and k < dp.t.M else INF  # (the first stage's in-flight row, eq. T2)
            close = _close_first(dp, states, k, rows_of, unit, island, cap) if head is None else \
                _close_head(dp, states, k, head, rows_of[head[0]][head_w == head[1]], cap)
            best = min(best, close, key=lambda x: x[0])
        if k >= K or k not in dp.nonfirst:
            break
        if k == 1 and tail is not None:
            states, back = _tail_start(dp, dp.nonfirst[1][0], rows_of[tail[0]][tail_w == tail[1]], tail[0],
                                       unit[tail[0]][1])
        else:
            states, back = _advance(dp, states, dp.nonfirst[k][0], rows_of, unit, k == 1, island)
        if pure and k < dp.t.M:  # eq. N10's in-flight row k of eq. T2: slots 1..k's times and links <= k tau <= k b
            states = {key: F for key, F in states.items() if _cut(F, inflight_cap(k, dp.b))}
            back = {key: back[key] for key in states}
        if pure and math.isfinite(best[0]):  # the later parts that cannot end below the best found: dropped
            cap = best[0] * (1 + PRUNE_RTOL) - floor  # [l]: the least the L - l layers still to place cost
            states = {key: F for key, F in states.items() if _cut(F, cap[:, None])}
            back = {key: back[key] for key in states}
        trace.append(back)
        if not states:
            break
    if best[1] is None:
        return None
    return _backtrack(dp, best[1], trace, rows_of, unit)


def _cut(F: np.ndarray, cap) -> bool:
    """F with every entry past ``cap`` (s, ``inflight_cap``; or [L+1, 1] per layer count) set to inf, in place; False
    when none is left."""
    F[F > cap] = INF
    return bool(np.isfinite(F).any())


def _units_up(d: np.ndarray, cap: int) -> tuple[np.ndarray, int]:
    """Weights and capacity in units q: the gcd of the stage sizes, doubled while it leaves more than RMAX units;
    a stage whose size q does not divide gets weight R + 1 (left out). Every path within R units then fits the
    group's GPUs exactly (a heuristic may lose plans, never make a bad one). Measured: rounding the weights up
    instead (q = ceil(cap / 64)) lost the three-type optimum, which fills its H100 group to the GPU."""
    q = reduce(math.gcd, [int(x) for x in d if x > 0], 0) or 1
    while cap // q > RMAX:
        q *= 2
    R = cap // q
    return np.where(d % q == 0, d // q, R + 1), R


def _sources(dp: PathDP, states: dict, g: int, start: bool, island: np.ndarray):
    """Where a stage of group g at the current slot may follow from: (earlier key, F, link, stay, new key). An empty
    set is eq. LS4j's tail (``_tail_start``): its group may come again only as a segment of its own."""
    if start:
        yield None, None, 0.0, False, (1 << g, g)
        return
    for (mask, h), F in states.items():
        if not mask and h == g:  # (the tail is one stage: its units are not in F)
            continue
        new = _step(dp.G, island, mask, h, g)
        if new is not None:
            yield (mask, h), F, dp.link[g, h], h == g, (new, g)


def _step(G: int, island: np.ndarray, mask: int, h: int, g: int) -> int | None:
    """The state's set after a stage of group g follows one of group h (None: not a segment plan). The set holds
    bit g for each group placed on the current island and bit G + i for each island i left behind: leaving an
    island forgets its groups (no later stage may come back to it), so on I islands of G/I groups there are
    I 2^(G/I) sets where G groups on one island have 2^G."""
    if g == h:
        return mask
    if island[g] == island[h]:
        return None if mask >> g & 1 else mask | 1 << g
    if mask >> (G + int(island[g])) & 1:
        return None
    return (mask >> G << G) | 1 << (G + int(island[h])) | 1 << g


def _later(F, link, R: int, stay: bool, L: int):
    """The later part a stage needs, per its units wv: (rest(wv): [L+1] the least over the units r left, where(wv):
    [L+1] that r, or None). Off a stay neither depends on wv; on a stay ``where`` is made on first use (only an
    improving first stage reads it)."""
    if F is None:
        z = np.full(L + 1, INF)
        z[0] = 0.0
        return (lambda wv: z), (lambda wv: np.zeros(L + 1, np.int64))
    if not stay:
        rp = F.argmin(axis=1)
        v = F[np.arange(L + 1), rp] + link
        return (lambda wv: v), (lambda wv: rp)
    pre = np.minimum.accumulate(F, axis=1)
    arg: list = []

    def where(wv: int):
        if wv > R:
            return None
        if not arg:
            arg.append(_prefix_arg(F, pre))
        return arg[0][:, R - wv]

    return (lambda wv: pre[:, R - wv] + link if wv <= R else np.full(L + 1, INF)), where


def _prefix_arg(F: np.ndarray, pre: np.ndarray) -> np.ndarray:
    """[l, r] an r' <= r reaching the prefix minimum of F[l, :r+1] (``pre``, the running minimum along r; the last
    position where it was reached)."""
    idx = np.where(F <= pre, np.arange(F.shape[1])[None, :], 0)
    return np.maximum.accumulate(idx, axis=1)


def _close_first(dp: PathDP, states: dict, k: int, rows_of, unit, island: np.ndarray, cap: float = INF):
    """(least total, where) with the pipeline's first stage at slot k; ``cap``: the most its time and the later
    slots' times and links may add up to (eq. T2's in-flight row k)."""
    L = dp.L
    cost, opt = dp.first[k]
    time_part = None if math.isinf(cap) else np.take_along_axis(dp._first_parts[k][0], opt, axis=0)  # [rows, L+1]
    best = (INF, None)
    for g in range(dp.G):
        w, R = unit[g]
        rows = rows_of[g]
        if not len(rows):
            continue
        # per unit value: its rows, their costs and (under the cap) their times without the sync, [rows, n]
        by_w = [(wv, sel, cost[sel], None if time_part is None else time_part[sel], cost[sel].min(axis=0))
                for wv in np.unique(w).tolist() if wv <= R for sel in (rows[w == wv],)]
        for prev, F, link, stay, _ in _sources(dp, states, g, k == 1, island):
            if not math.isfinite(link):
                continue
            if F is None and k != 1:
                continue
            rest_of, where = _later(F, link, R, stay, L)
            for wv, sel, cost_w, time_w, least_w in by_w:
                rest = rest_of(wv)
                later_part = rest[::-1][None, :]  # [1, n]: the later slots' part with L - n layers
                if not (least_w + later_part[0] < best[0]).any():  # (no entry below the best: tot >= this, exactly)
                    continue
                tot = cost_w + later_part  # [rows, n]
                if time_w is not None:
                    tot = np.where(time_w + later_part <= cap, tot, INF)
                i, n = np.unravel_index(int(np.argmin(tot)), tot.shape)
                if tot[i, n] < best[0]:
                    rp = where(wv)
                    r_prev = None if rp is None else int(rp[L - n])
                    best = (float(tot[i, n]), (k, int(sel[i]), int(n), prev, r_prev))
    return best


def _tail_start(dp: PathDP, cost: np.ndarray, sel: np.ndarray, g: int, R: int):
    """Eq. LS4j: slot 1 (the last stage) one of the rows ``sel`` of group g, as the state (empty set, g): no group is
    placed, so g may come again as a segment of its own, within the R units left to it (``segment_plan`` sets the
    tail's aside). The state's F keeps the tail's cost at 0 units; ``_backtrack`` reads it as a start's."""
    L = dp.L
    if not len(sel):
        return {}, {}
    lidx = np.arange(L + 1)
    j = cost[sel].argmin(axis=0)
    best_n = cost[sel][j, lidx]  # [L+1]: the least tail of n layers
    F = np.full((L + 1, R + 1), INF)
    F[:, 0] = best_n
    if not np.isfinite(F).any():
        return {}, {}
    src = np.full((L + 1, R + 1), -1)
    src[np.isfinite(best_n), 0] = 0
    return {(0, g): F}, {(0, g): (src, [(None, lidx, sel[j], np.zeros(L + 1, np.int64), 0)])}


def _close_head(dp: PathDP, states: dict, k: int, head: tuple[int, int], sel: np.ndarray, cap: float = INF):
    """Eq. LS4g: (least total, where) with the pipeline's first stage at slot k one of the rows ``sel`` of group g
    (``head`` = (g, wv), the rows of wv units), after any state whose slot k - 1 is another group's: the head is a
    segment of its own, outside the island rule of ``_step`` (a plan may cross islands twice; the caller checks and
    prices it). ``cap`` as ``_close_first``'s."""
    g = head[0]
    if k == 1 or not len(sel):
        return INF, None
    L = dp.L
    cost, opt = dp.first[k]
    cost_w = cost[sel]  # [rows, n]
    time_w = None if math.isinf(cap) else np.take_along_axis(dp._first_parts[k][0], opt, axis=0)[sel]
    least_w = cost_w.min(axis=0)
    best = (INF, None)
    for (mask, h), F in states.items():
        link = dp.link[g, h]
        if h == g or not math.isfinite(link):
            continue
        rp = F.argmin(axis=1)  # (off a stay: the later part does not depend on the head's units)
        later_part = (F[np.arange(L + 1), rp] + link)[::-1][None, :]  # [1, n]: the later slots with L - n layers
        if not (least_w + later_part[0] < best[0]).any():
            continue
        tot = cost_w + later_part
        if time_w is not None:
            tot = np.where(time_w + later_part <= cap, tot, INF)
        i, n = np.unravel_index(int(np.argmin(tot)), tot.shape)
        if tot[i, n] < best[0]:
            best = (float(tot[i, n]), (k, int(sel[i]), int(n), (mask, h), int(rp[L - n])))
    return best


def _ends_of_tp(dp: PathDP, p: int) -> PathDP:
    """The node's DP with the first stage's tables and slot 1's (the last stage) kept to the options of tp p (inf
    elsewhere): eq. U2's plans whose two ends are of tp p. A shallow copy; the other slots' tables are shared."""
    out = copy.copy(dp)
    other = dp.t.tp != p

    def rows(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return dp._rows(np.where(other[:, None], INF, cost))

    out.first = {k: rows(dp._base(k, True)) for k in dp.first}
    out.nonfirst = dict(dp.nonfirst)
    if 1 in dp.nonfirst:
        out.nonfirst[1] = rows(dp._base(1, False))
    return out


def sync_capped(dp: PathDP, cap_s: float, per_stage_s: float = 0.0) -> PathDP:
    """Eq. LS4h: the node's DP with the plans whose exposed sync sigma stays within ``cap_s`` (s) by the stages after
    the first: the non-first stage at slot k (its DP sync s_j: ``sync_fixed`` + ``sync_per_layer`` n, plus
    ``sync_last`` at slot 1) is left out (inf) where s_j exceeds cap_s + ``per_stage_s`` (P - k), P the least stage
    count the node allows (the variant's under interleaving): eq. T3 offsets s_j by beta times the j = P - k stages
    before it, which the caller estimates per stage. The first stage's sync is priced as max(s_0, cap_s): below the
    cap it costs nothing more, sigma being at the later stages' level anyway. A shallow copy."""
    out = copy.copy(dp)
    n = np.arange(dp.L + 1, dtype=float)[None, :]
    P = dp.t.num_stages if dp.t.vpp > 1 else dp.p_first
    out.nonfirst = {}
    for k in dp.nonfirst:
        per, const = sync_parts(dp.t.coef, False, k == 1)
        sync = n * per[:, None] + const[:, None]  # [n_opts, L+1]
        room = cap_s + per_stage_s * max(P - k, 0)
        out.nonfirst[k] = dp._rows(np.where(sync > room, INF, dp._base(k, False)))
    out.first = {}
    for k in dp.first:
        tm, sy = dp._base(k, True, parts=True)
        out.first[k] = dp._rows(tm + np.maximum(sy, cap_s))
    return out


def same_tp_plans(dp: PathDP, island: np.ndarray, budget_s: float = math.inf,
                  stop: float = math.inf) -> list[Assignment | None]:
    """Eq. LS4g: under eq. U2 (first and last stage of one tp), per tp p of the options, the least segment plan with
    both ends of tp p; then, per tp p and group g, the least with, in addition, the first stage a second segment of g
    (a head) of each of g's HEAD_SIZES smallest first-stage sizes of tp p. Runs start only while their expected end
    (the mean run so far) lies within ``budget_s`` of the call's start (each run is not interruptible). Why:
    FlagScale's tied embeddings (eq. U2) make the last stage's tp the first's; gpt3-13b on 64 H100 @ib + 64 A100-40
    @roce: the optimum, 4.6519 s, is an A100 stage of tp 4, eight H100 stages, six A100 stages ending at tp 4, which
    eq. LS4 (one segment per group) cannot make, and half of LS4's plans there break eq. U2."""
    t0 = time.perf_counter()
    rows_of = _own_rows(dp)
    jobs: list = []
    heads: list = []
    for p in np.unique(dp.t.tp).tolist():
        ends = _ends_of_tp(dp, p)
        if not (any(np.isfinite(c).any() for c, _ in ends.first.values())
                and (1 not in ends.nonfirst or np.isfinite(ends.nonfirst[1][0]).any())):
            continue  # (no first stage or no last stage of tp p fits the node)
        jobs.append((ends, None))
        heads.extend((ends, (g, wv)) for g, sizes in head_sizes(ends, rows_of).items() for wv in sizes)
    out: list = []
    for ends, head in jobs + heads:
        spent = time.perf_counter() - t0
        if out and spent + spent / len(out) > budget_s:
            break
        out.append(segment_plan(ends, island, head=head, stop=stop))
    return out


def tail_plans(dps: list[PathDP], island: np.ndarray, order: list[int], budget_s: float = math.inf,
               stop: float = math.inf) -> list[Assignment | None]:
    """Eq. LS4j: eq. LS4's plans whose last stage alone is a second segment of a group (``segment_plan``'s ``tail``),
    per (group, units) of ``tail_sizes`` (groups in ``order`` first), each on every DP of ``dps`` (the node's, and
    eq. LS4h's sync-capped one) before the next size. Runs start only while their expected end lies within
    ``budget_s`` of the call's start (as eq. LS4g's). Why: the last stage holds the output layer, so it wants a fast
    group with memory to spare, while a group with slow links wants to sit late in the pipeline, where eq. T3 hides
    most of its sync: megatron-39b on 256 each of H100, A100-80, V100-32, L40S, the optimum (2.5772 s) is 17 H100
    stages, 6 A100, 8 L40S, then one A100 stage; eq. LS4's best there 2.6016 s, with an A100 tail of 64 GPUs 2.5772 s."""
    t0 = time.perf_counter()
    out: list = []
    for g, wv in tail_sizes(dps[0], order):
        for dp in dps:  # (a size on each DP before the next pair)
            spent = time.perf_counter() - t0
            if out and spent + spent / len(out) > budget_s:
                return out
            out.append(segment_plan(dp, island, stop=stop, tail=(g, wv)))
    return out


def tail_sizes(dp: PathDP, order: list[int]) -> list[tuple[int, int]]:
    """Eq. LS4j's (group, units) pairs: per group with stages of its own, the unit counts (``_units_up``) of its rows
    that may be the last stage (finite at slot 1), taken round-robin over the groups (in ``order``, then the rest)
    from each one's largest."""
    if 1 not in dp.nonfirst:
        return []
    rows_of = _own_rows(dp)
    last = np.isfinite(dp.nonfirst[1][0]).any(axis=1)
    sizes = []
    for g in dict.fromkeys([g for g in order if 0 <= g < dp.G] + list(range(dp.G))):
        rows = rows_of[g]
        if len(rows):
            w, R = _units_up(dp.row_usage[rows, g].astype(np.int64), int(dp.cap[g]))
            sizes.append([(g, int(x)) for x in sorted(set(w[last[rows] & (w < R)].tolist()), reverse=True)])
    return [pair for rank in itertools.zip_longest(*sizes) for pair in rank if pair is not None]


def head_sizes(ends: PathDP, rows_of: list) -> dict[int, list[int]]:
    """Eq. LS4g: per group with stages of its own, the HEAD_SIZES smallest unit counts (``_units_up``) of its rows that
    may be a first stage on ``ends``' tables (finite at some slot)."""
    out = {}
    for g, rows in enumerate(rows_of):
        if not len(rows):
            continue
        w, R = _units_up(ends.row_usage[rows, g].astype(np.int64), int(ends.cap[g]))
        usable = np.zeros(len(rows), bool)
        for cost, _ in ends.first.values():
            usable |= np.isfinite(cost[rows]).any(axis=1)
        out[g] = [int(x) for x in sorted(set(w[usable & (w <= R)].tolist()))[:HEAD_SIZES]]
    return out


def _advance(dp: PathDP, states: dict, cost: np.ndarray, rows_of, unit, start: bool, island: np.ndarray):
    """One non-first slot: the new states and, per state, (src [L+1, R+1], candidates (earlier key, n, row, r_prev))."""
    L = dp.L
    new, back = {}, {}
    lidx = np.arange(L + 1)
    m = lidx[:, None] - lidx[None, :]
    ok, mm = m >= 0, np.maximum(m, 0)
    for g in range(dp.G):
        w, R = unit[g]
        rows = rows_of[g]
        if not len(rows):
            continue
        sizes = _stage_rows(cost, rows, w, R, lidx)
        for prev, F, link, stay, key in _sources(dp, states, g, start, island):
            if not math.isfinite(link):
                continue
            if key not in new:
                new[key] = np.full((L + 1, R + 1), INF)
                back[key] = (np.full((L + 1, R + 1), -1), [])
            Fk, (src, cands) = new[key], back[key]
            if stay:  # (the band of layer counts and units where F is finite: outside it every sum is inf)
                V, fin = _shifted(F, L), np.isfinite(F)
                rows_f, cols_f = np.flatnonzero(fin.any(axis=1)), np.flatnonzero(fin.any(axis=0))
            else:  # (off a stay the later part does not depend on the stage's units)
                rest_of, where = _later(F, link, R, stay, L)
                rest, rp = rest_of(0), where(0)
                rest_ln = np.where(ok, rest[mm], INF)  # [l, n]: rest[l - n], inf for n > l
            for wv, sel, j, best_n, ns in sizes:
                if stay:
                    l0, l1 = rows_f[0] + ns[0], min(L, rows_f[-1] + ns[-1]) + 1  # the rows and units a stage of
                    c1 = min(cols_f[-1], R - wv) + 1  # ns layers and wv units can reach from F's band
                    if l0 >= l1 or cols_f[0] >= c1:
                        continue
                    c0 = cols_f[0]
                    cut = slice(ns[0], ns[-1] + 1) if ns[-1] - ns[0] + 1 == len(ns) else ns  # (a view when a run)
                    tot = V[l0:l1, c0:c1, cut] + best_n[ns]  # [l, r', n]
                    tot += link
                    at = tot.argmin(axis=2)  # the fewest layers reaching the least
                    val = tot.min(axis=2)
                    tgt = Fk[l0:l1, c0 + wv:c1 + wv]
                    better = val < tgt
                    if better.any():
                        tgt[better] = val[better]
                        jn = np.zeros((L + 1, R + 1 - wv), np.int64)  # [l, r']: layers of the stage (read on the band)
                        jn[l0:l1, c0:c1] = ns[at]
                        ci = len(cands)
                        cands.append((prev, jn, sel[j[jn]], None, wv))
                        src[l0:l1, c0 + wv:c1 + wv][better] = ci
                else:  # (inf + best_n is inf: the same values as np.where(ok, best_n + rest[mm], inf))
                    tot = best_n[None, :] + rest_ln  # [l, n]
                    n = tot.argmin(axis=1)
                    val = tot[lidx, n]
                    better = val < Fk[:, wv]
                    if better.any():
                        Fk[better, wv] = val[better]
                        ci = len(cands)
                        cands.append((prev, n, sel[j[n]], rp, wv))
                        src[better, wv] = ci
    keep = {key: F for key, F in new.items() if np.isfinite(F).any()}
    return keep, {key: back[key] for key in keep}


def _stage_rows(cost: np.ndarray, rows: np.ndarray, w: np.ndarray, R: int, lidx: np.ndarray) -> list:
    """Per unit value wv of the group's stages (those within R): (wv, its rows, [L+1] the row of least cost per layer
    count, [L+1] that cost, the layer counts it can hold); the same for every state the slot extends."""
    out = []
    for wv in np.unique(w).tolist():
        if wv > R:
            continue
        sel = rows[w == wv]
        j = cost[sel].argmin(axis=0)
        best_n = cost[sel][j, lidx]
        ns = np.flatnonzero(np.isfinite(best_n))
        if len(ns):
            out.append((wv, sel, j, best_n, ns))
    return out


def _shifted(F: np.ndarray, L: int) -> np.ndarray:
    """[l, r, n] = F[l - n, r], inf for n > l: a view of F stacked under L + 1 rows of inf (no copy), so a stage of n
    layers on top of the later part F is one gather over n."""
    pad = np.vstack([np.full((L + 1, F.shape[1]), INF), F])  # pad[L + 1 + i] = F[i]
    return sliding_window_view(pad[::-1], L + 1, axis=0)[: L + 1][::-1]


def _backtrack(dp: PathDP, at, trace, rows_of, unit) -> Assignment | None:
    """The plan of the least path: its first stage at ``at`` = (k, row, n, earlier key, r_prev)."""
    t = dp.t
    k, row, n, key, r = at
    stages = [(int(dp.first[k][1][row, n]), n)]
    left = dp.L - n
    for kk in range(k - 1, 0, -1):
        src, cands = trace[kk - 1][key]
        ci = int(src[left, r])
        if ci < 0:
            return None
        prev, an, ar, rp, wv = cands[ci]
        if rp is None and an.ndim == 2:  # a stage of the same group: arrays over [l, r - wv]
            n_k, row_k = int(an[left, r - wv]), int(ar[left, r - wv])
            r_next = r - wv
        else:  # the group's first stage (from an earlier group, or slot 1)
            n_k, row_k = int(an[left]), int(ar[left])
            r_next = None if rp is None else int(rp[left - n_k])
        stages.append((int(dp.nonfirst[kk][1][row_k, n_k]), n_k))
        left -= n_k
        key, r = prev, r_next
    if left != 0:
        return None
    return Assignment(t.v, tuple(Stage(int(t.opts[i]), n) for i, n in stages))
