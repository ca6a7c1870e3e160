"""The two dynamic programs of the DP heuristic (formulations/dp.md); used only by ``dp.py``.

* ``coverage``: for a stage-time bound tau, which pipeline structures (GPU groups as contiguous
  segments in some order, one GPU count per segment) can hold the most layers (eqs. DP2, DP3);
* ``split``: for a structure and tau, the per-stage options and layer counts that minimise
  sum_j t_j subject to t_j + (outgoing link) <= tau (eq. DP4; Alpa's inner DP, Zheng et al.
  2022, sec. 5.2, with each stage's budget reduced by its link so that the in-flight term of
  eq. T2 stays within tau).

Both take ``charge`` ([E, E], default ``t.p2p``): what a stage's outgoing link takes of its budget (eq. DP8b
charges a link between islands less than its time; the plans are scored by ``evaluate`` either way).
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


class CapCache:
    """stage_caps per time budget (a budget is tau less the stage's outgoing link, eq. DP1)."""

    def __init__(self, t: Tables, r: Restriction):
        self.t, self.r, self.cache = t, r, {}

    def __call__(self, budget: float):
        key = round(budget, 15)
        if key not in self.cache:
            self.cache[key] = stage_caps(self.t, budget, self.r)
        return self.cache[key]


def _segments(t: Tables, cls: Classes, caps_at: CapCache, gpu_caps, tau: float, g: int, link: float):
    """For group g whose bottom slot sends to the next stage over ``link`` (0 at slot 1):
    seg[s, e] most layers of a segment on slots s+1..e (non-final), segf[s, e] the same with
    slot e the first stage, arg/argf the class used. Every slot's budget is tau less its
    outgoing link (eq. DP1), so the in-flight term of eq. T2 stays within tau (eq. DP2)."""
    K = t.K
    seg = np.full((K + 1, K + 1), NEG, np.int64)
    segf = np.full((K + 1, K + 1), NEG, np.int64)
    arg = np.full((K + 1, K + 1), -1, np.int64)
    argf = np.full((K + 1, K + 1), -1, np.int64)
    s_idx, e_idx = np.meshgrid(np.arange(K + 1), np.arange(K + 1), indexing="ij")
    span = e_idx - s_idx
    h_in, hf_in = caps_at(tau - t.p2p[g, g])
    h_bo, hf_bo = caps_at(tau - link)
    s_c = np.minimum(s_idx, K - 1)
    for c in np.flatnonzero(cls.group == g):
        mem, d = cls.members[c], int(cls.gpus[c])
        A, Af = h_in[:, mem].max(axis=1), hf_in[:, mem].max(axis=1)  # [K] best per slot
        B, Bf = h_bo[:, mem].max(axis=1), hf_bo[:, mem].max(axis=1)
        pre = np.concatenate([[0], np.cumsum(A)])
        zer = np.concatenate([[0], np.cumsum(A < 1)])
        ok = (span >= 1) & (span * d <= gpu_caps[g]) & (s_idx < K)
        lo = np.minimum(s_idx + 1, K)
        mid_ok = zer[np.maximum(e_idx, lo)] - zer[lo] == 0
        val = np.where(ok & (B[s_c] >= 1) & mid_ok, B[s_c] + pre[np.maximum(e_idx, lo)] - pre[lo], NEG)
        better = val > seg
        seg, arg = np.where(better, val, seg), np.where(better, c, arg)
        top = np.maximum(e_idx - 1, lo)
        inner_ok = zer[top] - zer[lo] == 0
        two = B[s_c] + pre[top] - pre[lo] + Af[np.clip(e_idx - 1, 0, K - 1)]
        valf = np.where(span == 1, np.where(Bf[s_c] >= 1, Bf[s_c], NEG),
                        np.where((B[s_c] >= 1) & inner_ok & (Af[np.clip(e_idx - 1, 0, K - 1)] >= 1), two, NEG))
        valf = np.where(ok, valf, NEG)
        better = valf > segf
        segf, argf = np.where(better, valf, segf), np.where(better, c, argf)
    return seg, segf, arg, argf


def coverage(t: Tables, cls: Classes, caps_at: CapCache, gpu_caps, tau: float, max_segments: int,
             charge: np.ndarray | None = None) -> dict:
    """Best structure per stage count P: {P: (layers, [(group, class, s, e), ...] from slot 1 up)}.
    GPU groups form contiguous segments in any order (eq. DP3): a DP over (set of groups used,
    group of the topmost segment) with back pointers. ``charge``: the links' budget charges (module doc)."""
    memo: dict = {}
    charge = t.p2p if charge is None else charge

    def segs(g, last):
        link = 0.0 if last < 0 else float(charge[g, last])
        if (g, link) not in memo:
            memo[g, link] = _segments(t, cls, caps_at, gpu_caps, tau, g, link)
        return memo[g, link]

    groups = sorted({int(g) for g in cls.group})
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
                if used >> g & 1:
                    continue
                seg, segf, _, _ = segs(g, last)
                tot = F[:, None] + segf
                val, s_at = tot.max(axis=0), tot.argmax(axis=0)
                for e in np.flatnonzero((val >= t.L) & (np.arange(t.K + 1) <= t.L)):
                    if e not in best or val[e] > best[e][0]:
                        best[int(e)] = (int(val[e]), key, g, int(s_at[e]))
                tot = F[:, None] + seg
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
        structure = [(g, int(segs(g, key[1])[3][s, p]), s, p)]
        e = s
        while key != (0, -1):
            _, prev, s_arr = states[key]
            s_prev = int(s_arr[e])
            pkey = prev[e]
            structure.append((key[1], int(segs(key[1], pkey[1])[2][s_prev, e]), s_prev, e))
            key, e = pkey, s_prev
        out[p] = (val, structure[::-1])
    return out


def split(t: Tables, cls: Classes, structure, caps_at: CapCache, tau: float, charge: np.ndarray | None = None):
    """Eq. DP4: min sum_j t_j with t_j + (outgoing link) <= tau for the given slots ->
    [(local option, n)] from slot 1 up, or None. ``structure``: [(group, class, s, e)] from
    slot 1 up; the top slot is the first stage. ``charge``: the links' budget charges (module doc)."""
    L = t.L
    charge = t.p2p if charge is None else charge
    lt, ft, xt = t.coef["layer_time"], t.coef["first_time"], t.coef["last_time"]
    P = structure[-1][3]
    group_of = {}
    for g, _, s, e in structure:
        for k in range(s + 1, e + 1):
            group_of[k] = g
    n_arr = np.arange(L + 1)
    li, ni = np.meshgrid(n_arr, n_arr, indexing="ij")  # [l, n]
    prev_idx = np.clip(li - ni, 0, L)
    valid = (li - ni >= 0) & (ni >= 1)
    G = np.full(L + 1, np.inf)
    G[0] = 0.0
    choice = []
    for g, c, s, e in structure:
        mem = cls.members[c]
        for k in range(s + 1, e + 1):
            first = k == P
            link = 0.0 if k == 1 else float(charge[g, group_of[k - 1]])
            h, hf = caps_at(tau - link)
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


__all__ = ["CapCache", "Classes", "Restriction", "coverage", "option_classes", "split", "stage_caps"]
