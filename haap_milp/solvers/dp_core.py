"""The two dynamic programs of the DP heuristic (formulations/dp.md); used only by ``dp.py``.

* ``coverage``: for a stage-time bound tau, which pipeline structures (GPU groups as contiguous
  segments in some order, one GPU count per segment) can hold the most layers (eqs. DP2, DP3);
* ``split``: for a structure and tau, the per-stage options and layer counts that minimise
  sum_j t_j subject to t_j <= tau (eq. DP4; Alpa's inner DP, Zheng et al. 2022, sec. 5.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haap_milp.solvers.common import Tables

NEG = -(10**9)


@dataclass
class Restriction:
    """Options usable at every slot, and at the pipeline ends (eqs. U1, U2)."""

    every: np.ndarray  # bool [n]
    ends: np.ndarray  # bool [n]: the first stage and slot 1


def stage_caps(t: Tables, tau: float, r: Restriction) -> tuple[np.ndarray, np.ndarray]:
    """h[k-1, i], hf[k-1, i]: layers option i can hold at slot k within tau (eq. DP1)."""
    lt, ft, xt = t.coef["layer_time"], t.coef["first_time"], t.coef["last_time"]
    with np.errstate(divide="ignore", invalid="ignore"):
        base = np.floor(tau * (1 + 1e-12) / lt)
        h = np.minimum(t.U_mem, base[None, :]).astype(np.int64)
        hf = np.minimum(t.Uf_mem, np.floor((tau * (1 + 1e-12) - ft) / lt)[None, :]).astype(np.int64)
        h[0] = np.minimum(t.U_mem[0], np.floor((tau * (1 + 1e-12) - xt) / lt))
        hf[0] = np.minimum(t.Uf_mem[0], np.floor((tau * (1 + 1e-12) - ft - xt) / lt))
    h[:, ~r.every] = 0
    h[0, ~r.ends] = 0
    hf[:, ~(r.every & r.ends)] = 0
    return np.maximum(h, 0), np.maximum(hf, 0)


@dataclass
class Classes:
    """Option classes (group, GPUs per stage): a segment uses one class."""

    group: np.ndarray  # [C]
    gpus: np.ndarray  # [C]
    members: list  # [C] arrays of local option indices


def option_classes(t: Tables, r: Restriction) -> Classes:
    keys = sorted({(int(g), int(d)) for g, d, ok in zip(t.group, t.gpus, r.every) if ok})
    members = [np.flatnonzero((t.group == g) & (t.gpus == d) & r.every) for g, d in keys]
    return Classes(np.array([g for g, _ in keys], np.int64), np.array([d for _, d in keys], np.int64), members)


def _segments(t: Tables, cls: Classes, h, hf, caps, tau: float):
    """seg[g]: [K+1, K+1] most layers of a segment of group g on slots s+1..e (value at [s, e]),
    non-final; segf[g]: the same with slot e the first stage; arg*: the class used (eq. DP2)."""
    K = t.K
    G = len(caps)
    seg = np.full((G, K + 1, K + 1), NEG, np.int64)
    segf = np.full((G, K + 1, K + 1), NEG, np.int64)
    arg = np.full((G, K + 1, K + 1), -1, np.int64)
    argf = np.full((G, K + 1, K + 1), -1, np.int64)
    s_idx, e_idx = np.meshgrid(np.arange(K + 1), np.arange(K + 1), indexing="ij")
    span = e_idx - s_idx
    for c, mem in enumerate(cls.members):
        g, d = int(cls.group[c]), int(cls.gpus[c])
        cv = h[:, mem].max(axis=1)  # [K] best per slot
        cf = hf[:, mem].max(axis=1)
        pre = np.concatenate([[0], np.cumsum(cv)])
        zer = np.concatenate([[0], np.cumsum(cv < 1)])
        ok = (span >= 1) & (span * d <= caps[g])
        if t.p2p[g, g] > tau:
            ok &= span == 1
        val = np.where(ok & (zer[e_idx] - zer[s_idx] == 0), pre[e_idx] - pre[s_idx], NEG)
        better = val > seg[g]
        seg[g] = np.where(better, val, seg[g])
        arg[g] = np.where(better, c, arg[g])
        top = np.maximum(e_idx - 1, 0)
        below_ok = zer[top] - zer[s_idx] == 0
        top_cf = cf[np.maximum(e_idx - 1, 0)]
        valf = np.where(ok & below_ok & (top_cf >= 1), pre[top] - pre[s_idx] + top_cf, NEG)
        better = valf > segf[g]
        segf[g] = np.where(better, valf, segf[g])
        argf[g] = np.where(better, c, argf[g])
    return seg, segf, arg, argf


def coverage(t: Tables, cls: Classes, h, hf, caps, tau: float, max_segments: int) -> dict:
    """Best structure per stage count P: {P: (layers, [(group, class, s, e), ...] from slot 1 up)}.
    GPU groups form contiguous segments in any order (eq. DP3): a DP over (set of groups used,
    group of the topmost segment) with back pointers; boundaries slower than tau are excluded."""
    seg, segf, arg, argf = _segments(t, cls, h, hf, caps, tau)
    groups = [g for g in range(len(caps)) if (arg[g] >= 0).any() or (argf[g] >= 0).any()]
    init = np.full(t.K + 1, NEG, np.int64)
    init[0] = 0
    states = {(0, -1): (init, None, None)}  # (set bits, last) -> (F, prev key per e, s per e)
    frontier = [(0, -1)]
    best: dict = {}
    for _ in range(min(max_segments, len(groups))):
        nxt: dict = {}
        for key in frontier:
            F = states[key][0]
            used, last = key
            for g in groups:
                if used >> g & 1 or (last >= 0 and t.p2p[g, last] > tau):
                    continue
                tot = F[:, None] + segf[g]
                val, s_at = tot.max(axis=0), tot.argmax(axis=0)
                for e in np.flatnonzero((val >= t.L) & (np.arange(t.K + 1) <= t.L)):
                    if e not in best or val[e] > best[e][0]:
                        best[int(e)] = (int(val[e]), key, g, int(s_at[e]))
                tot = F[:, None] + seg[g]
                val, s_at = tot.max(axis=0), tot.argmax(axis=0)
                nk = (used | 1 << g, g)
                if nk not in nxt:
                    nxt[nk] = (np.full(t.K + 1, NEG, np.int64), [None] * (t.K + 1), np.zeros(t.K + 1, np.int64))
                F2, prev, s2 = nxt[nk]
                for e in np.flatnonzero(val > F2):
                    F2[e], prev[e], s2[e] = val[e], key, s_at[e]
        states.update(nxt)
        frontier = [k for k, v in nxt.items() if (v[0] > NEG // 2).any()]
    out = {}
    for p, (val, key, g, s) in best.items():
        segs = [(g, int(argf[g, s, p]), s, p)]
        e = s
        while key != (0, -1):
            _, prev, s_arr = states[key]
            s_prev = int(s_arr[e])
            segs.append((key[1], int(arg[key[1], s_prev, e]), s_prev, e))
            key, e = prev[e], s_prev
        out[p] = (val, segs[::-1])
    return out


def split(t: Tables, cls: Classes, structure, h, hf, r: Restriction):
    """Eq. DP4: min sum_j t_j with t_j <= tau for the given slots -> [(local option, n)] from
    slot 1 up, or None. ``structure``: [(group, class, s, e)] from slot 1 up; the top slot is first."""
    L = t.L
    lt, ft, xt = t.coef["layer_time"], t.coef["first_time"], t.coef["last_time"]
    P = structure[-1][3]
    n_arr = np.arange(L + 1)
    li, ni = np.meshgrid(n_arr, n_arr, indexing="ij")  # [l, n]
    prev_idx = np.clip(li - ni, 0, L)
    valid = (li - ni >= 0) & (ni >= 1)
    G = np.full(L + 1, np.inf)
    G[0] = 0.0
    choice = []
    for g, c, s, e in structure:
        for k in range(s + 1, e + 1):
            first = k == P
            mem = cls.members[c]
            cap = (hf if first else h)[k - 1, mem]
            extra = (ft[mem] if first else 0.0 * ft[mem]) + (xt[mem] if k == 1 else 0.0)
            cost = n_arr[None, :] * lt[mem][:, None] + extra[:, None]  # [|mem|, L+1]
            cost = np.where(n_arr[None, :] <= cap[:, None], cost, np.inf)
            best_o = cost.argmin(axis=0)
            best_c = cost.min(axis=0)
            tot = np.where(valid, G[prev_idx] + best_c[ni], np.inf)
            choice.append((tot.argmin(axis=1), mem[best_o]))
            G = tot.min(axis=1)
    if not np.isfinite(G[L]):
        return None
    out, l_left = [], L
    for back_n, opt in reversed(choice):
        n = int(back_n[l_left])
        out.append((int(opt[n]), n))
        l_left -= n
    return out[::-1]  # slot 1 first


__all__ = ["Restriction", "Classes", "option_classes", "stage_caps", "coverage", "split"]
