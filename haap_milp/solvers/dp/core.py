"""The two dynamic programs of the DP heuristic (formulations/dp.md); used only by ``dp.py``.

* ``coverage``: for a stage-time bound tau, which pipeline structures (GPU groups as contiguous
  segments in some order, one GPU count per segment) can hold the most layers (eqs. DP2, DP3);
* ``split``: for a structure and tau, the per-stage options and layer counts that minimise
  sum_j t_j subject to t_j + (outgoing link) <= tau (eq. DP4; Alpa's inner DP, Zheng et al.
  2022, sec. 5.2, with each stage's budget reduced by its link so that the in-flight term of
  eq. T2 stays within tau).

Both take ``charge`` ([G, G] by GPU group, ``group_links`` of ``t.p2p`` or of eq. DP8b's charges): what a stage's
outgoing link takes of its budget (eq. DP8b charges a link between islands less than its time; the plans are scored
by ``evaluate`` either way).
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


def owners(t: Tables) -> np.ndarray:
    """[n] the GPU group each option draws from, -1 for a mixed option (eq. H1, several groups). An option's p2p
    endpoint (``t.group``) is its group, or under eq. Q2 its own (group, tp) row: the DP's segments are GPU
    groups either way."""
    use = t.use > 0
    return np.where(use.sum(axis=1) == 1, use.argmax(axis=1), -1)


def group_links(t: Tables, every: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[G, G] per pair of GPU groups the largest of ``m`` ([E, E] s per micro-batch, by endpoint) between the
    endpoints of their options in ``every``: the DP charges a boundary by its groups alone (eqs. DP1, DP2), so
    under eq. Q2, where a stage's link depends on the tp of both ends, it charges the slowest pair. That can only
    shrink a stage's budget: the plans stay feasible (and are scored by ``evaluate`` on their own links)."""
    own = owners(t)
    G = t.use.shape[1]
    out = np.zeros((G, G))
    ends = [np.unique(t.group[every & (own == g)]) for g in range(G)]
    for g in range(G):
        for h in range(G):
            if len(ends[g]) and len(ends[h]):
                out[g, h] = m[np.ix_(ends[g], ends[h])].max()
    return out


def option_classes(t: Tables, r: Restriction) -> Classes:
    own = owners(t)
    keys = sorted({(int(g), int(d)) for g, d, ok in zip(own, t.gpus, r.every) if ok})
    members = [np.flatnonzero((own == g) & (t.gpus == d) & r.every) for g, d in keys]
    return Classes(np.array([g for g, _ in keys], np.int64), np.array([d for _, d in keys], np.int64), members)


class CapCache:
    """stage_caps per time budget (a budget is tau less the stage's outgoing link, eq. DP1), and per budget the most
    layers each option class's best member holds at each slot (``by_class``: what ``_segments`` reads)."""

    def __init__(self, t: Tables, r: Restriction, cls: Classes):
        self.t, self.r, self.cache, self.classes = t, r, {}, {}
        # the classes' members side by side (each class holds one option at least), for one reduceat per budget
        self.perm = np.concatenate(cls.members) if cls.members else np.zeros(0, np.int64)
        self.starts = np.cumsum([0] + [len(m) for m in cls.members[:-1]])

    def __call__(self, budget: float):
        key = round(budget, 15)
        if key not in self.cache:
            self.cache[key] = stage_caps(self.t, budget, self.r)
        return self.cache[key]

    def by_class(self, budget: float) -> tuple[np.ndarray, np.ndarray]:
        """[C, K] per class and slot the most layers of its best member, non-first and first stage."""
        key = round(budget, 15)
        if key not in self.classes:
            self.classes[key] = tuple(np.maximum.reduceat(h[:, self.perm], self.starts, axis=1).T
                                      for h in self(budget))
        return self.classes[key]


def _segments(t: Tables, cls: Classes, caps_at: CapCache, gpu_caps, tau: float, g: int, link: float, inner: float):
    """For group g whose bottom slot sends to the next stage over ``link`` (0 at slot 1), and its stages to each
    other over ``inner``:
    seg[s, e] most layers of a segment on slots s+1..e (non-final), segf[s, e] the same with
    slot e the first stage, arg/argf the class used. Every slot's budget is tau less its
    outgoing link (eq. DP1), so the in-flight term of eq. T2 stays within tau (eq. DP2)."""
    K = t.K
    cs = np.flatnonzero(cls.group == g)
    if not len(cs):
        none = np.full((K + 1, K + 1), NEG, np.int64)
        return none, none.copy(), np.full_like(none, -1), np.full_like(none, -1)
    s_idx, e_idx = np.meshgrid(np.arange(K + 1), np.arange(K + 1), indexing="ij")
    span = e_idx - s_idx
    s_c = np.minimum(s_idx, K - 1)
    # per class c of the group (axis 0) and slot: the most layers its best member holds, [C, K]
    A, Af, B, Bf = (h[cs] for h in caps_at.by_class(tau - inner) + caps_at.by_class(tau - link))
    d = cls.gpus[cs][:, None, None]
    pre = np.concatenate([np.zeros((len(cs), 1), np.int64), np.cumsum(A, axis=1)], axis=1)  # [C, K+1]
    zer = np.concatenate([np.zeros((len(cs), 1), np.int64), np.cumsum(A < 1, axis=1)], axis=1)
    ok = (span >= 1) & (span * d <= gpu_caps[g]) & (s_idx < K)  # [C, K+1, K+1]
    lo = np.minimum(s_idx + 1, K)
    hi = np.maximum(e_idx, lo)
    Bs, Bfs = B[:, s_c], Bf[:, s_c]
    val = np.where(ok & (Bs >= 1) & (zer[:, hi] - zer[:, lo] == 0), Bs + pre[:, hi] - pre[:, lo], NEG)
    top = np.maximum(e_idx - 1, lo)
    Afe = Af[:, np.clip(e_idx - 1, 0, K - 1)]
    two = Bs + pre[:, top] - pre[:, lo] + Afe
    valf = np.where(span == 1, np.where(Bfs >= 1, Bfs, NEG),
                    np.where((Bs >= 1) & (zer[:, top] - zer[:, lo] == 0) & (Afe >= 1), two, NEG))
    valf = np.where(ok, valf, NEG)
    seg, segf = val.max(axis=0), valf.max(axis=0)  # the first class reaching the most (one at a time: strict >)
    arg = np.where(seg > NEG, cs[val.argmax(axis=0)], -1)
    argf = np.where(segf > NEG, cs[valf.argmax(axis=0)], -1)
    return seg, segf, arg, argf


def coverage(t: Tables, cls: Classes, caps_at: CapCache, gpu_caps, tau: float, max_segments: int,
             charge: np.ndarray) -> dict:
    """Best structure per stage count P: {P: (layers, [(group, class, s, e), ...] from slot 1 up)}.
    GPU groups form contiguous segments in any order (eq. DP3): a DP over (set of groups used,
    group of the topmost segment) with back pointers. ``charge``: the links' budget charges (module doc).
    One level (segment count) at a time, every state and group together (``_level``); ties go to the earlier state
    and the lower group, as one pair at a time in that order would."""
    memo: dict = {}

    def segs(g, last):
        link = 0.0 if last < 0 else float(charge[g, last])
        if (g, link) not in memo:
            memo[g, link] = _segments(t, cls, caps_at, gpu_caps, tau, g, link, float(charge[g, g]))
        return memo[g, link]

    groups = sorted({int(g) for g in cls.group})
    K1 = t.K + 1
    init = np.full(K1, NEG, np.int64)
    init[0] = 0
    keys = [(0, -1)]  # state id -> (set bits, last)
    states = {(0, -1): (init, None, None)}  # (set bits, last) -> (F, prev state id per e, s per e)
    frontier = [0]
    best_val, best_at = np.full(K1, NEG, np.int64), [None] * K1  # per P: layers, (state, group, s)
    for _ in range(min(max_segments, len(groups))):
        if not frontier:
            break
        si, gi, (valf, sf), (val, sv) = _level(t, [keys[i] for i in frontier], [states[keys[i]][0] for i in frontier],
                                               groups, segs)
        cand = np.where((valf >= t.L) & (np.arange(K1) <= t.L), valf, NEG)  # [pairs, K+1]
        pick = cand.argmax(axis=0)  # the first pair reaching the most
        top = cand[pick, np.arange(K1)]
        for e in np.flatnonzero(top > best_val):
            r = int(pick[e])
            best_val[e], best_at[e] = top[e], (keys[frontier[si[r]]], groups[gi[r]], int(sf[r, e]))
        order: dict = {}
        for r, (a, b) in enumerate(zip(si.tolist(), gi.tolist())):
            order.setdefault((keys[frontier[a]][0] | 1 << groups[b], groups[b]), []).append(r)
        nxt = []
        for nk, rows in order.items():
            j = val[rows].argmax(axis=0)  # rows in processing order: the first one reaching the most
            at = np.asarray(rows)[j]
            F2 = np.maximum(val[at, np.arange(K1)], NEG)
            states[nk] = (F2, np.asarray(frontier, np.int64)[si[at]], sv[at, np.arange(K1)])
            keys.append(nk)
            if (F2 > NEG // 2).any():
                nxt.append(len(keys) - 1)
        frontier = nxt
    out = {}
    for p in np.flatnonzero(best_val > NEG).tolist():
        key, g, s = best_at[p]
        structure = [(g, int(segs(g, key[1])[3][s, p]), s, p)]
        e = s
        while key != (0, -1):
            _, prev, s_arr = states[key]
            s_prev = int(s_arr[e])
            pkey = keys[int(prev[e])]
            structure.append((key[1], int(segs(key[1], pkey[1])[2][s_prev, e]), s_prev, e))
            key, e = pkey, s_prev
        out[p] = (int(best_val[p]), structure[::-1])
    return out


def _level(t: Tables, keys: list, Fs: list, groups: list, segs):
    """One segment more on each state (set bits, last) with layers F [K+1] on slots 1..s, for each group g not in its
    set: the most layers up to slot e with g's segment on slots s+1..e, and the first s reaching it. Returns the pairs
    (state index [pairs], group index [pairs], state-major) and, per pair, ([pairs, K+1] layers, [pairs, K+1] s) for
    a final segment (``segf``) and a non-final one. Int32 with s innermost: the reduction runs over contiguous
    memory (the sums stay >= 2 NEG)."""
    F = np.stack(Fs).astype(np.int32)  # [S, K+1]
    ok = np.array([[not used >> g & 1 for g in groups] for used, _ in keys])
    si, gi = np.nonzero(ok)
    lasts = sorted({last for _, last in keys})
    li = np.searchsorted(lasts, [last for _, last in keys])
    blank = np.full((t.K + 1, t.K + 1), NEG, np.int32)
    out = []
    for part in (1, 0):  # segf, then seg; SEG [last, group, e, s]
        SEG = np.stack([np.stack([segs(g, last)[part].T if g != last else blank for g in groups]) for last in lasts])
        tot = F[si][:, None, :] + SEG.astype(np.int32)[li[si], gi]  # [pairs, e, s]
        out.append((tot.max(axis=2).astype(np.int64), tot.argmax(axis=2)))
    return si, gi, out[0], out[1]


def split(t: Tables, cls: Classes, structure, caps_at: CapCache, tau: float, charge: np.ndarray):
    """Eq. DP4: min sum_j t_j with t_j + (outgoing link) <= tau for the given slots ->
    [(local option, n)] from slot 1 up, or None. ``structure``: [(group, class, s, e)] from
    slot 1 up; the top slot is the first stage. ``charge``: the links' budget charges (module doc)."""
    L = t.L
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


__all__ = ["CapCache", "Classes", "Restriction", "coverage", "group_links", "option_classes", "owners", "split",
           "stage_caps"]
