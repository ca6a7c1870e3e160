"""The stage DP of eq. N4 with one group's GPUs in its state (eq. N5, formulations/README.md).

The Lagrangian bound of ``stage_dp`` prices GPUs; when stages are large against a group's capacity its
dual has a gap (measured: llama3-70b on 4096 H100, a path of 64 + 4 x 1024 GPUs priced below every plan
that fits). Here group s's GPUs are a state instead: a stage of d GPUs of s takes w = floor(d / q) units of
R = floor(cap_s / q), with q the gcd of the stage sizes (exact) or, when that leaves more than RMAX units,
ceil(cap_s / RMAX) (a relaxation: sum d <= cap implies sum floor(d / q) <= floor(cap / q), eq. G2's
rounding). The other groups keep their multipliers. State (group of the slot, layers held, units used):
``[G, L+1, R+1]`` per slot; a bound valid for every plan of the node, like eq. N4's.
"""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

from haap_milp.problem import Assignment, Problem, Stage
from haap_milp.solvers.common.stage_dp import INF, PathDP

RMAX = 64  # most capacity units in the state (cost ~ slots x weights x L x n_max x RMAX)


def _units(d: np.ndarray, cap: int) -> tuple[np.ndarray, int, int]:
    """Weights w = floor(d / q), capacity R = floor(cap / q) and the unit q of the state group."""
    sizes = [int(x) for x in d if x > 0]
    q = reduce(math.gcd, sizes, 0) or 1
    if cap // q > RMAX:
        q = -(-cap // RMAX)
    return (d // q).astype(np.int64), cap // q, q


def capacity_bound(problem: Problem, dp: PathDP, a: float, mu: np.ndarray, s: int) -> tuple[float, Assignment | None]:
    """Lower bound on T over the node of ``dp`` (inf: no plan) with group ``s`` in the state and the other
    groups priced by ``mu``; and the least path as a plan when it fits every group's GPUs."""
    t, G = dp.t, dp.G
    cap = np.asarray(problem.group_capacity, float)
    w, R, q = _units(dp.usage[:, s], int(cap[s]))  # per option
    w_row = (dp.row_usage[:, s] // q).astype(np.int64)  # per footprint row (its options' own w)
    mu_o = np.where(np.arange(G) == s, 0.0, np.maximum(mu, 0.0))
    mu_cost = (dp.row_usage @ mu_o)[:, None]
    keys = sorted({(int(g), int(x)) for g, x in zip(dp.row_group, w_row) if x <= R})
    F, trace, best = None, [], (INF, None)
    for k in range(1, dp.k_max + 1):
        H = argH = None
        if F is not None:  # the best later part when slot k is in group g: [g, m, r]
            Hgh = F[None] + dp.link[:, :, None, None]
            argH = Hgh.argmin(axis=1)
            H = np.take_along_axis(Hgh, argH[:, None], axis=1)[:, 0]
        if k in dp.first:
            cost, opt = dp.first[k]
            best = min(best, _first(dp, k, cost + mu_cost, opt, H, argH, w_row, R), key=lambda x: x[0])
        if k >= dp.k_max:
            break
        cost, opt = dp.nonfirst[k]
        F, step = _slot(dp, cost + mu_cost, opt, H, keys, w_row, R)
        trace.append((*step, argH))
    if not math.isfinite(best[0]):
        return INF, None
    plan = _path(dp, best[1], trace, w, cap)
    return t.tau_weight * a + best[0] - float(mu_o @ cap), plan


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


def _slot(dp: PathDP, cost: np.ndarray, opt: np.ndarray, H, keys, w: np.ndarray, R: int):
    """F at slot k (non-first) and its choices (argN, argI: layers and option) per (g, l, r); ``cost``,
    ``opt``, ``w`` per footprint row."""
    L, G = dp.L, dp.G
    F = np.full((G, L + 1, R + 1), INF)
    argN = np.zeros((G, L + 1, R + 1), np.int64)
    argI = np.zeros((G, L + 1, R + 1), np.int64)
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
    if left != 0 or r != 0 or np.any(used > cap):
        return None
    return Assignment(t.v, tuple(Stage(int(t.opts[i]), n) for i, n in stages))
