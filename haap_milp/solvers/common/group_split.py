"""Eq. N15: every GPU group's capacity in its own state, the stage order relaxed (formulations/README.md).

The Lagrangian bound (eq. N4) prices the groups' GPU rows, and with several GPU types its dual is weak: the least
paths overfill a weighted mix of groups (formulations/README.md, eq. N11: on llama3-70b x 3 types x 1024 GPUs the
subgradient stopped 2.8-6.7 s below the cut-off). Eq. N5 puts one group's GPUs in the state and prices the rest.
Here every group keeps its own capacity exactly, at the price of the stage order:

    T >= (M - 1) a + sum_j t_j + sum_j c_j + s_0                     (eq. N4's right side, sigma >= s_0)

is a sum over stages, and only the slot of a stage (its memory: in-flight micro-batches, eqs. M2, D1, X1) and its
links tie it to the others. So per group g, over g's own stages counted from the end of the pipeline:

- a *middle* stage (neither first nor last) that is the i-th of g's middle stages from the end sits at some slot
  k >= i + 1 (slot 1 is the last stage), so its cost is at least the least over k in [i + 1, K - 1] of the slot
  tables (a suffix minimum; the tables' memory bounds only shrink with k, and eq. D1's lower bounds only grow
  the other way, so the suffix keeps every (option, layers) that any of those slots allows);
- every stage but the first pays the link into it, at least the least usable link into its endpoint;
- the last stage is slot 1's table; the first stage, with i middle stages of its own group, sits at slot
  P >= i + 2, so it pays the least of the first-stage tables of slots max(P_lo, i + 2) .. K;
- the group's stages fit its GPUs: units in the DP's state as in eq. N5 (``capacity_dp._units``: exact with the
  gcd of the stage sizes, else eq. G2's rounding, a relaxation).

Per group a DP over (middle count, layers, units) gives the least cost of g's stages with none / the last / the
first / both of the end stages; a min-plus convolution over (middle count, layers) across groups, with exactly one
first and one last stage, gives the least over pipelines of P = 2 + (middle stages) in [P_lo, K] stages, plus the
one-stage pipelines. Every plan of the node maps to a term of that minimum at no more than its cost, so the result
is a lower bound (tested against brute force, tests/test_group_split.py). A mixed stage (eq. H1) is charged to the
group it takes the largest share of (its draw on the other group left out: a relaxation). It needs rows of at least
two groups; a budget row keeps its multiplier. It yields no plan (the order is lost).
"""

from __future__ import annotations

import math

import numpy as np

from haap_milp.solvers.common.capacity_dp import _units
from haap_milp.solvers.common.stage_dp import INF, PathDP


def applies(dp: PathDP) -> bool:
    """Rows of at least two groups exist (a mixed row, eq. H1, counts for the group it is charged to: ``_owner``)."""
    return len(np.unique(_owner(dp))) >= 2


def _owner(dp: PathDP) -> np.ndarray:
    """[rows] the one group whose state a row's stage is charged to: the group of which it takes the largest share
    of the GPUs. A mixed row (eq. H1) also draws from another group; leaving that draw out of every state only
    relaxes the GPU rows, so the bound stays a bound."""
    share = dp.row_usage[:, :dp.G] / np.maximum(dp.cap[:dp.G], 1.0)[None, :]
    return np.argmax(share, axis=1)


def group_split_bound(dp: PathDP, a: float, mu: np.ndarray) -> float:
    """Eq. N15's lower bound on T over the node of ``dp`` (inf: no plan); ``mu``: multipliers, of which only the
    budget row's (after the G groups) is used: every group's GPUs are in a state."""
    G, L, t = dp.G, dp.L, dp.t
    mu_o = np.maximum(np.asarray(mu, float)[:len(dp.cap)], 0.0).copy()
    mu_o[:G] = 0.0
    mu_cost = (dp.row_usage @ mu_o)[:, None]  # [rows, 1]: the budget row's price
    lin = _link_in(dp)[:, None]  # [rows, 1]: the least usable link into the row's endpoint
    owner = _owner(dp)
    K = dp.k_max
    best = INF
    if 1 in dp.first:  # one stage: all layers, the first and last stage at once
        cost, _ = dp.first[1]
        for g in range(G):
            rows = np.flatnonzero(owner == g)
            w, R, _ = _units(dp.row_usage[rows, g].astype(np.int64), int(dp.cap[g]))
            ok = w <= R
            if np.any(ok):
                best = min(best, float((cost[rows[ok], L] + mu_cost[rows[ok], 0]).min()))
    if K >= 2:
        parts = [_group_values(dp, np.flatnonzero(owner == g), g, mu_cost, lin) for g in range(G)]
        parts = [p for p in parts if p is not None]
        C = _combine(parts, L, K)  # [I, L+1]: first and last placed, I middle stages
        for i in range(C.shape[0]):
            if max(dp.p_first, 2) <= i + 2 <= K:
                best = min(best, float(C[i, L]))
    if not math.isfinite(best):
        return INF
    return t.tau_weight * a + best - float(mu_o @ dp.cap)


def priced_bound(dp: PathDP, a: float, mu: np.ndarray) -> tuple[float]:
    """``group_split_bound`` in the (bound, ...) form ``dual_bundle.with_gpu_time`` wraps (eq. N12's lam around it)."""
    return (group_split_bound(dp, a, mu),)


def _link_in(dp: PathDP) -> np.ndarray:
    """[rows] the least usable link from any endpoint into each row's endpoint (inf: none)."""
    into = dp.link.min(axis=0)  # [E]: over the earlier stage's endpoint
    return into[dp.row_group]


def _suffix_min(tables: list[np.ndarray]) -> list[np.ndarray]:
    out, acc = [None] * len(tables), None
    for i in range(len(tables) - 1, -1, -1):
        acc = tables[i] if acc is None else np.minimum(acc, tables[i])
        out[i] = acc
    return out


def _group_values(dp: PathDP, rows: np.ndarray, g: int, mu_cost: np.ndarray, lin: np.ndarray):
    """[4, I, L+1] the least cost of group g's stages holding l layers with I middle stages, with none (0), the
    last (1), the first (2) or both (3) of the pipeline's end stages; None when the group has no row."""
    if not len(rows):
        return None
    L, K = dp.L, dp.k_max
    w, R, _ = _units(dp.row_usage[rows, g].astype(np.int64), int(dp.cap[g]))
    keep = w <= R
    rows, w = rows[keep], w[keep]
    if not len(rows):
        return None
    extra = mu_cost[rows] + lin[rows]
    I = max(K - 1, 1)  # middle counts 0 .. K - 2
    mids = [dp.nonfirst[k][0][rows] + extra for k in range(2, K)]  # slots 2 .. K-1
    mid = _suffix_min(mids)  # mid[i - 1]: the i-th middle stage (slot >= i + 1)
    last = dp.nonfirst[1][0][rows] + extra if 1 in dp.nonfirst else None
    firsts = {k: dp.first[k][0][rows] + mu_cost[rows] for k in dp.first if k >= 2}
    F = np.full((I, L + 1, R + 1), INF)  # [i, l, r]: i middle stages, l layers, r units
    F[0, 0, 0] = 0.0
    for i in range(1, I):
        F[i] = _step(F[i - 1], mid[i - 1], w, R)
    out = np.full((4, I, L + 1), INF)
    Fl = np.stack([_step(F[i], last, w, R) for i in range(I)]) if last is not None else None
    out[0] = F.min(axis=2)
    if last is not None:
        out[1] = np.stack([_close(F[i], last, w, R) for i in range(I)])
    first_at = _suffix_first(firsts, dp, I)
    for i in range(I):
        if first_at[i] is None:
            continue
        out[2, i] = _close(F[i], first_at[i], w, R)
        if Fl is not None:
            out[3, i] = _close(Fl[i], first_at[i], w, R)
    return out


def _suffix_first(firsts: dict, dp: PathDP, I: int) -> list:
    """Per middle count i of the first stage's own group: the least first-stage table over the slots
    max(P_lo, i + 2) .. K (the pipeline has at least i + 2 stages)."""
    K = dp.k_max
    out, acc = [None] * I, None
    for k in range(K, 1, -1):
        if k in firsts and k >= dp.p_first:
            acc = firsts[k] if acc is None else np.minimum(acc, firsts[k])
        i = k - 2
        if 0 <= i < I:
            out[i] = acc
    return out


def _step(F: np.ndarray, cost: np.ndarray, w: np.ndarray, R: int) -> np.ndarray:
    """One more stage: [l, r] -> [l, r], the stage a row (units w) holding n layers at ``cost[row, n]``."""
    L = F.shape[0] - 1
    out = np.full_like(F, INF)
    lidx = np.arange(L + 1)
    m = lidx[:, None] - lidx[None, :]  # [l, n]: layers before the stage
    ok = m >= 0
    mm = np.maximum(m, 0)
    for wv in np.unique(w).tolist():
        best_n = cost[w == wv].min(axis=0)  # [L+1]
        ns = np.flatnonzero(np.isfinite(best_n))
        if not len(ns):
            continue
        src = F[:, : R + 1 - wv]  # [l, r]
        tens = np.where(ok[:, ns, None], best_n[ns][None, :, None] + src[mm[:, ns]], INF)  # [l, n, r]
        np.minimum(out[:, wv:], tens.min(axis=1), out=out[:, wv:])
    return out


def _close(F: np.ndarray, cost: np.ndarray, w: np.ndarray, R: int) -> np.ndarray:
    """[l] the least of F plus one more stage (a row of units w holding n layers at ``cost[row, n]``) over every
    unit count within R: the group's stages closed."""
    L = F.shape[0] - 1
    pre = np.minimum.accumulate(F, axis=1)  # [l, r]: least over units <= r
    lidx = np.arange(L + 1)
    m = lidx[:, None] - lidx[None, :]
    ok, mm = m >= 0, np.maximum(m, 0)
    out = np.full(L + 1, INF)
    for wv in np.unique(w).tolist():
        best_n = cost[w == wv].min(axis=0)
        rest = pre[:, R - wv]  # [l]
        val = np.where(ok, best_n[None, :] + rest[mm], INF).min(axis=1)
        np.minimum(out, val, out=out)
    return out


def _combine(parts: list[np.ndarray], L: int, K: int) -> np.ndarray:
    """Min-plus convolution of the groups' [4, I, L+1] values over (middle count, layers), with the first and the
    last stage each in exactly one group: [I, L+1] with both placed."""
    I = K - 1
    C = None  # [4 flags, I, L+1]; flag bits: 1 last placed, 2 first placed
    lidx = np.arange(L + 1)
    m = lidx[:, None] - lidx[None, :]  # [l total, l of the new group]
    ok, mm = m >= 0, np.maximum(m, 0)
    for V in parts:
        V = V[:, :I]
        if C is None:
            C = V.copy()
            continue
        new = np.full_like(C, INF)
        for f in range(4):
            if not np.isfinite(C[f]).any():
                continue
            shifted = np.where(ok[None], C[f][:, mm], INF)  # [i, l total, l new]
            for x in range(4):
                if f & x:
                    continue
                for j in np.flatnonzero(np.isfinite(V[x]).any(axis=1)).tolist():
                    if j >= I:
                        break
                    val = (shifted[: I - j] + V[x, j][None, None, :]).min(axis=2)  # [I - j, L+1]
                    np.minimum(new[f | x, j:], val, out=new[f | x, j:])
        C = new
    return C[3]
