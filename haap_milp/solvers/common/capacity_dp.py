"""The stage DP of eq. N4 with one group's GPUs in its state (eq. N5, formulations/README.md).

The Lagrangian bound of ``stage_dp`` prices GPUs; when stages are large against a group's capacity its
dual has a gap (measured: llama3-70b on 4096 H100, a path of 64 + 4 x 1024 GPUs priced below every plan
that fits). Here group s's GPUs are a state instead: a stage of d GPUs of s takes w = floor(d / q) units of
R = floor(cap_s / q), with q the gcd of the stage sizes (exact) or, when that leaves more than RMAX units,
ceil(cap_s / RMAX) (a relaxation: sum d <= cap implies sum floor(d / q) <= floor(cap / q), eq. G2's
rounding). The other groups keep their multipliers. State (p2p endpoint of the slot, layers held, units used):
``[E, L+1, R+1]`` per slot; a bound valid for every plan of the node, like eq. N4's.

Eq. N6: ``s`` may be a set S of groups; the state then counts their summed GPUs against their summed capacity
(sum_{g in S} usage_g <= sum_{g in S} cap_g is the sum of S's G1 rows, so every plan meets it: a relaxation,
sound for any S). It is what bounds two islands of one GPU type: the Lagrangian path put 1536 GPUs on one of
two 512-GPU groups and the single-group DP let the path move them to the other group's multiplier; with
both groups' GPUs in the state the 1024-GPU total binds (the links stay exact: the state keeps the endpoint).

Eq. N10: where every priced row is in the state (and eq. N12 prices no GPU-time row) a slot's cost is its time and links alone, so the in-flight rows of
eq. T2 cut states (``crossing_bound``: eq. N6's crossing case with its real links); eq. N9 (``island_parts``): with
no usable link between islands each island is bounded on its own.
"""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

from haap_milp.problem import Assignment, Problem, Stage
from haap_milp.solvers.common.stage_dp import INF, PathDP, inflight_cap

USE_INFLIGHT_CUT = True  # eq. N10 in the capacity DPs whose costs are times and links alone
KEEP_MU = False  # eq. N13b: sound, tested, off by default (it cost the 4096 x 1 type x 2 islands proof; formulations)
USE_BOTH_PRICES = True  # eq. N6c: with eq. N13b off, each island case also with the multipliers kept (the larger counts)
RMAX = 64  # most capacity units in the state (cost ~ slots x weights x L x n_max x RMAX)


def _units(d: np.ndarray, cap: int) -> tuple[np.ndarray, int, int]:
    """Weights w = floor(d / q), capacity R = floor(cap / q) and the unit q of the state group."""
    sizes = [int(x) for x in d if x > 0]
    q = reduce(math.gcd, sizes, 0) or 1
    if cap // q > RMAX:
        q = -(-cap // RMAX)
    return (d // q).astype(np.int64), cap // q, q


def capacity_bound(problem: Problem, dp: PathDP, a: float, mu: np.ndarray, s, rows_ok: np.ndarray | None = None,
                   link: np.ndarray | None = None, keep_mu: bool = False) -> tuple[float, Assignment | None]:
    """Lower bound on T over the node of ``dp`` (inf: no plan) with the GPUs of group ``s`` (an index, or a
    set of groups: their summed GPUs against their summed capacity, eq. N6) in the state and the other
    groups priced by ``mu``; and the least path as a plan when it fits every group's GPUs. ``rows_ok``: the
    footprint rows the path may use (default all); ``link``: the [E, E] link costs in place of the node's;
    ``keep_mu``: the state's groups keep their multipliers too (eq. N13b, ``keep_multipliers``)."""
    t, cap = dp.t, dp.cap  # the groups' GPUs, then the budget row (priced by mu, never in the state here)
    S = np.zeros(len(cap), bool)
    S[np.atleast_1d(np.asarray(s, np.int64))] = True
    w, R, q = _units(dp.usage[:, S].sum(axis=1), int(cap[S].sum()))  # per option
    w_row = (dp.row_usage[:, S].sum(axis=1) // q).astype(np.int64)  # per footprint row (its options' own w)
    mu_o = np.maximum(mu, 0.0) if keep_mu else np.where(S, 0.0, np.maximum(mu, 0.0))
    mu_cost = (dp.row_usage @ mu_o)[:, None]
    if rows_ok is not None:
        mu_cost = np.where(rows_ok[:, None], mu_cost, INF)
    link = dp.link if link is None else link
    keys = sorted({(int(g), int(x)) for g, x in zip(dp.row_group, w_row) if x <= R})
    # eq. N10: with every priced row in the state (mu_o = 0 where any option draws) a non-first slot's cost is its
    # time and links alone, so F at slot k is the least sum_{k' <= k} t + sum_{k' < k} c of its state, and the
    # in-flight row k < M of eq. T2 (that sum <= k tau <= k b) rules out every state whose least exceeds k b
    pure = (USE_INFLIGHT_CUT and t.vpp <= 1 and not dp.extra_priced
            and not np.any(mu_o[dp.usage.any(axis=0)] > 0))
    F, trace, best = None, [], (INF, None)
    for k in range(1, dp.k_max + 1):
        H = argH = None
        if F is not None:  # the best later part when slot k is at endpoint e: [e, m, r]
            Hgh = F[None] + link[:, :, None, None]
            argH = Hgh.argmin(axis=1)
            H = np.take_along_axis(Hgh, argH[:, None], axis=1)[:, 0]
        if k in dp.first:
            cost, opt = dp.first[k]
            best = min(best, _first(dp, k, cost + mu_cost, opt, H, argH, w_row, R), key=lambda x: x[0])
        if k >= dp.k_max:
            break
        cost, opt = dp.nonfirst[k]
        F, step = _slot(dp, cost + mu_cost, opt, H, keys, w_row, R)
        if pure and k < t.M:
            F[F > inflight_cap(k, dp.b)] = INF
        trace.append((*step, argH))
    if not math.isfinite(best[0]):
        return INF, None
    plan = _path(dp, best[1], trace, w, cap)  # (checked against every row)
    return t.tau_weight * a + best[0] - float(mu_o @ cap), plan


def island_blocks(problem: Problem, dp: PathDP) -> np.ndarray | None:
    """Block (island) of each p2p endpoint, from the group names ``type@island``; None when there is one block or
    an endpoint's options draw from groups of several blocks (eq. N6's case split needs one block per endpoint).
    The names only choose the split: the bound of ``island_bound`` is sound for any partition of the groups."""
    group_block = problem.group_island
    if group_block.max(initial=0) == 0:
        return None
    out = np.full(dp.E, -1)
    for r, e in enumerate(dp.row_group):
        blocks = set(group_block[dp.row_usage[r, :dp.G] > 0].tolist())  # (its groups; not the budget row)
        if len(blocks) != 1 or out[e] not in (-1, *blocks):
            return None
        out[e] = blocks.pop()
    return out


def island_parts(problem: Problem, dp: PathDP) -> list[np.ndarray] | None:
    """Eq. N9: when no link between two islands is usable in the node (c/2 > b for every one, vpp c/2 > b interleaved:
    a plan's tau is at least half of each of its links, eq. T2, vpp halves, eq. I2; ``dp.link``), every plan of the node
    lies inside one island; then [n] masks of the options of each island (their endpoint's block, ``island_blocks``),
    so that each island is bounded on its own (its DPs single-group when the island holds one GPU type) and the node's
    bound is the least of them. None otherwise."""
    blocks = island_blocks(problem, dp)
    if blocks is None:
        return None
    cross = (blocks[:, None] != blocks[None, :]) & (blocks[:, None] >= 0) & (blocks[None, :] >= 0)
    if np.isfinite(dp.link[cross]).any():  # (an endpoint of block -1 has no option)
        return None
    own = blocks[dp.t.group]  # [n] the island of each option's endpoint
    return [own == blk for blk in np.unique(own).tolist()]


def keep_multipliers(dp: PathDP) -> bool:
    """Eq. N13b: whether the island cases (eq. N6) keep the stage DP's multipliers on the groups whose summed GPUs are in
    their state. Sound for any mu >= 0: a plan meets each group's row G1 and their sum, so relaxing the rows with mu
    while the sum stays a hard constraint is weak duality over the paths of the case; with the same mu each case is
    then at least eq. N4's LB(mu) restricted to its paths, so the least of the cases is at least LB(mu). Only where
    eq. N10's in-flight cut could not run anyway (it needs a state cost of time and links alone): eq. N12 prices the
    GPU-time rows, or vpp > 1, or the cut is off; elsewhere the cases run as before (mu 0 on the groups, cut on)."""
    return KEEP_MU and (dp.extra_priced or dp.t.vpp > 1 or not USE_INFLIGHT_CUT)


def island_bound(problem: Problem, dp: PathDP, a: float, blocks: np.ndarray, mu: np.ndarray,
                 empty: frozenset = frozenset()) -> tuple[float, list]:
    """Eq. N6: a bound by cases on the blocks (islands) a pipeline touches. A plan inside one block B uses only
    B's endpoints and at most B's GPUs (its groups' capacity summed, in the state); a plan touching two blocks
    crosses at least one boundary between them, which costs at least the cheapest cross-block link c_x, so it
    pays at least the least path with cross-block links priced 0 and every group's GPUs pooled, plus c_x. The
    node's bound is the least of the cases (inf: none has a path). Eq. N6c: the blocks of ``empty`` hold no plan (the
    caller's proof, eq. N11b) and add no case; where the cases price the groups at 0 (eq. N13b off), each case is also
    run with every group's multiplier kept, and the larger of its two values counts (each bounds the case's plans).
    Returns (bound, plans that fit)."""
    G, cap = dp.G, dp.cap
    group_block = problem.group_island
    keep = keep_multipliers(dp)  # eq. N13b: every group keeps its multiplier (else only the budget row)
    mu0 = np.maximum(mu, 0.0) if keep else np.where(np.arange(len(cap)) < G, 0.0, np.maximum(mu, 0.0))
    kept = np.maximum(mu, 0.0)
    both = USE_BOTH_PRICES and not keep and np.any(kept[:G] > 0)  # eq. N6c
    cases, lifts, plans = [], [], []
    for blk in np.unique(blocks[blocks >= 0]).tolist():
        S = np.flatnonzero(group_block == blk)
        if not cap[S].sum() or blk in empty:
            continue
        rows_ok = blocks[dp.row_group] == blk
        val, plan = capacity_bound(problem, dp, a, mu0, S, rows_ok=rows_ok, keep_mu=keep)
        cases.append(val)
        lifts.append(lambda S=S, rows_ok=rows_ok: capacity_bound(problem, dp, a, kept, S, rows_ok=rows_ok,
                                                                 keep_mu=True)[0])
        plans.append(plan)
    cross = (blocks[:, None] != blocks[None, :]) & (blocks[:, None] >= 0) & (blocks[None, :] >= 0)
    c_x = float(dp.link[cross].min(initial=INF))
    if math.isfinite(c_x):
        cases.append(crossing_bound(dp, a, mu0, cross, keep_mu=keep))
        lifts.append(lambda: crossing_bound(dp, a, kept, cross, keep_mu=True, pooled=False))
    while both and cases:  # (lazily: the least case lifted until the least is a lifted one; the same least as all)
        i = int(np.argmin(cases))
        if lifts[i] is None or not math.isfinite(cases[i]):
            break
        cases[i], lifts[i] = max(cases[i], lifts[i]()), None
    return min(cases, default=INF), [p for p in plans if p is not None]


def crossing_bound(dp: PathDP, a: float, mu: np.ndarray, cross: np.ndarray, keep_mu: bool = False,
                   pooled: bool = True) -> float:
    """Eq. N6's second case, a plan that crosses between islands: the least path with every group's GPUs pooled in the
    state that takes at least one link of ``cross`` ([E, E]), each link at its own cost (a flag in the state: crossed
    yet or not), so that the in-flight rows of eq. N10 see the crossing's link. At least the former bound (the least
    pooled path with crossing links at 0, plus the cheapest of them), which every such path pays. ``pooled`` False
    (eq. N6c, with ``keep_mu``): no GPUs in the state, every group's row G1 relaxed by its multiplier (weak duality
    over the crossing paths; a state of endpoint and flag alone)."""
    t, cap = dp.t, dp.cap
    S = np.zeros(len(cap), bool)
    S[:dp.G] = True
    if pooled:
        _, R, q = _units(dp.usage[:, S].sum(axis=1), int(cap[S].sum()))
        w_row = (dp.row_usage[:, S].sum(axis=1) // q).astype(np.int64)
    else:
        R, w_row = 0, np.zeros(len(dp.row_group), np.int64)
    mu_o = np.maximum(mu, 0.0) if keep_mu else np.where(S, 0.0, np.maximum(mu, 0.0))
    mu_cost = (dp.row_usage @ mu_o)[:, None]
    pure = (USE_INFLIGHT_CUT and t.vpp <= 1 and not dp.extra_priced
            and not np.any(mu_o[dp.usage.any(axis=0)] > 0))
    inside, over = np.where(cross, INF, dp.link), np.where(cross, dp.link, INF)
    keys = sorted({(int(g), int(x)) for g, x in zip(dp.row_group, w_row) if x <= R})
    F0 = F1 = None  # [e, m, r]: slots 1..k-1 without a crossing yet / with one
    best = INF
    for k in range(1, dp.k_max + 1):
        H0 = H1 = None
        if F0 is not None:
            H0 = (F0[None] + inside[:, :, None, None]).min(axis=1)
            H1 = np.minimum((F1[None] + dp.link[:, :, None, None]).min(axis=1),
                            (F0[None] + over[:, :, None, None]).min(axis=1))
        if k in dp.first and H1 is not None:
            cost, _ = dp.first[k]
            rest = _rest(dp, H1, w_row, R)  # [rows, L+1]: the later slots' least, within the units left
            tot = cost + mu_cost + rest
            if pure and k < t.M:  # the in-flight row of the whole pipeline: its time and links <= P b
                tmin = dp._rows(dp._first_parts[k][0])[0]  # (the least first-stage time of each row)
                tot = np.where(tmin + rest > inflight_cap(k, dp.b), INF, tot)
            best = min(best, float(tot.min()))
        if k >= dp.k_max:
            break
        cost, opt = dp.nonfirst[k]
        F0 = _slot(dp, cost + mu_cost, opt, H0, keys, w_row, R)[0]
        F1 = _slot(dp, cost + mu_cost, opt, H1, keys, w_row, R)[0] if H1 is not None else np.full_like(F0, INF)
        if pure and k < t.M:
            F0[F0 > inflight_cap(k, dp.b)] = INF
            F1[F1 > inflight_cap(k, dp.b)] = INF
    return t.tau_weight * a + best - float(mu_o @ cap)


def _first(dp: PathDP, k: int, cost: np.ndarray, opt: np.ndarray, H, argH, w: np.ndarray, R: int):
    """(least total, (k, option, layers, units used by the later slots, argH)) with the first stage at k;
    ``cost``, ``opt``, ``w`` per footprint row."""
    L = dp.L
    if H is None:
        tot = np.where(w <= R, cost[:, L], INF)
        i = int(np.argmin(tot))
        return float(tot[i]), (k, int(opt[i, L]), L, 0, None)
    pre = np.minimum.accumulate(H, axis=2)  # [g, m, r]: least over units <= r
    room = np.clip(R - w, -1, R)  # units the later slots may take (-1: the stage alone is too large)
    rest = pre[dp.row_group[:, None], (L - np.arange(L + 1))[None, :], np.maximum(room, 0)[:, None]]
    rest = np.where(room[:, None] >= 0, rest, INF)
    tot = cost + rest  # rest[i, n]: H[g_i, L - n, <= room_i]
    flat = int(np.argmin(tot))
    i, n = divmod(flat, L + 1)
    if not math.isfinite(tot[i, n]):
        return INF, None
    r = int(np.argmin(H[dp.row_group[i], L - n, : room[i] + 1]))
    return float(tot[i, n]), (k, int(opt[i, n]), n, r, argH)


def _rest(dp: PathDP, H: np.ndarray, w: np.ndarray, R: int) -> np.ndarray:
    """[rows, L+1]: the least later part H[g_i, L - n, <= R - w_i] of a first stage of row i holding n layers."""
    L = dp.L
    pre = np.minimum.accumulate(H, axis=2)
    room = np.clip(R - w, -1, R)
    rest = pre[dp.row_group[:, None], (L - np.arange(L + 1))[None, :], np.maximum(room, 0)[:, None]]
    return np.where(room[:, None] >= 0, rest, INF)


def _slot(dp: PathDP, cost: np.ndarray, opt: np.ndarray, H, keys, w: np.ndarray, R: int):
    """F at slot k (non-first) and its choices (argN, argI: layers and option) per (g, l, r); ``cost``,
    ``opt``, ``w`` per footprint row."""
    L, E = dp.L, dp.E
    F = np.full((E, L + 1, R + 1), INF)
    argN = np.zeros((E, L + 1, R + 1), np.int64)
    argI = np.zeros((E, L + 1, R + 1), np.int64)
    lidx = np.arange(L + 1)
    for g, wv in keys:
        members = np.flatnonzero((dp.row_group == g) & (w == wv))
        sub = cost[members]
        j = sub.argmin(axis=0)
        best_n = sub[j, lidx]  # [L+1]
        opt_n = opt[members[j], lidx]  # the option holding n layers
        ns = np.flatnonzero(np.isfinite(best_n))
        if not len(ns):
            continue
        if H is None:  # slot 1: n layers, wv units
            cand = np.full(L + 1, INF)
            cand[ns] = best_n[ns]
            better = cand < F[g, :, wv]
            F[g, better, wv] = cand[better]
            argN[g, better, wv] = lidx[better]
            argI[g, better, wv] = opt_n[lidx[better]]
            continue
        m = lidx[:, None] - ns[None, :]  # [l, n]
        ok = m >= 0
        tens = np.where(ok[:, :, None], best_n[ns][None, :, None] + H[g][np.maximum(m, 0)][:, :, : R + 1 - wv], INF)
        jn = tens.argmin(axis=1)  # [l, r']
        val = np.take_along_axis(tens, jn[:, None, :], axis=1)[:, 0, :]
        cur = F[g, :, wv:]
        better = val < cur
        cur[better] = val[better]
        argN[g, :, wv:][better] = ns[jn][better]
        argI[g, :, wv:][better] = opt_n[ns[jn]][better]
    return F, (argN, argI)


def _path(dp: PathDP, first, trace, w: np.ndarray, cap: np.ndarray) -> Assignment | None:
    """The least path as a plan when it fits every group's GPUs (None otherwise)."""
    t = dp.t
    k, i, n, r, argH = first
    stages = [(int(i), int(n))]
    left, g = t.L - n, int(t.group[i])
    for kk in range(k - 1, 0, -1):
        h = int(argH[g, left, r])
        argN, argI, argH = trace[kk - 1]
        n_k, i_k = int(argN[h, left, r]), int(argI[h, left, r])
        stages.append((i_k, n_k))
        left, r, g = left - n_k, r - int(w[i_k]), h
    used = sum(dp.usage[i] for i, _ in stages)
    if left != 0 or r != 0 or np.any(used > cap * (1 + 1e-9)):
        return None
    return Assignment(t.v, tuple(Stage(int(t.opts[i]), n) for i, n in stages))
