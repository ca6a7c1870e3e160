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
BEAM_PAIRS = 4096  # eq. DP3c: the most (state, group) pairs one level of eq. DP3 extends (states: this / groups)


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


@dataclass
class SegmentTable:
    """Eq. DP3's segments of one tau, every (group, link below) pair at once (``segment_table``): ``tab[part]``
    [pair + blank, e, s] int32, part 1 segf (the most layers of a segment on slots s+1..e with slot e the first
    stage), part 0 seg (a non-final one), transposed for ``_level``'s reductions over s; ``arg``/``argf`` [pair, s, e]
    the class used (-1: none); ``at[last + 1, g]`` the pair of group g above a segment of group ``last`` (-1: at slot
    1), or the blank row (all NEG) where g is last itself."""

    tab: tuple  # (seg, segf) as [pairs + 1, e, s] int32, the last row blank
    arg: np.ndarray  # [pairs, K+1, K+1]
    argf: np.ndarray
    at: np.ndarray  # [G+1, G] pair index, by (last + 1, group)

    def classes(self, g: int, last: int, first: bool) -> np.ndarray:
        """[s, e] the class of g's segment above ``last`` (``first``: the first stage's)."""
        return (self.argf if first else self.arg)[self.at[last + 1, g]]


def segment_table(t: Tables, cls: Classes, caps_at: CapCache, gpu_caps, tau: float, groups: list,
                  charge: np.ndarray) -> SegmentTable:
    """For each group g and each link below its bottom slot (0 at slot 1, else ``charge[g, last]``), with its stages
    sending to each other over ``charge[g, g]``: seg[s, e] the most layers of a segment on slots s+1..e (non-final),
    segf[s, e] the same with slot e the first stage, arg/argf the class used. Every slot's budget is tau less its
    outgoing link (eq. DP1), so the in-flight term of eq. T2 stays within tau (eq. DP2). All pairs in one pass of
    array operations over [pair, class, s, e] (the classes of a group padded to the most any group has; a padded class
    holds nothing): the per-pair arrays are small (K <= 32 slots, <= 7 classes), so per-call overhead dominated when
    each pair had its own pass (measured: 20k calls, 3.6 of 9.7 s of the DP on llama3-70b x 4096 GPUs x 8 groups)."""
    K, G = t.K, len(gpu_caps)
    pairs: dict = {}
    at = np.zeros((G + 1, G), np.int64)
    for g in groups:
        for last in [-1] + groups:
            if last != g:
                at[last + 1, g] = pairs.setdefault((g, 0.0 if last < 0 else float(charge[g, last])), len(pairs))
    blank = len(pairs)
    for g in groups:
        at[g + 1, g] = blank
    keys = list(pairs)
    members = [np.flatnonzero(cls.group == g) for g, _ in keys]
    C = max([len(m) for m in members] + [1])
    cs = np.full((len(keys), C), -1, np.int64)  # [P, C] class ids, -1: padding
    for i, m in enumerate(members):
        cs[i, :len(m)] = m
    real = cs >= 0
    cs0 = np.where(real, cs, 0)
    # per pair and class the most layers its best member holds at each slot, [P, C, K]: A, Af at tau less the link
    # inside the group, B, Bf at tau less the link below
    inner = [caps_at.by_class(tau - float(charge[g, g])) for g, _ in keys]
    below = [caps_at.by_class(tau - link) for _, link in keys]
    A, Af = (np.stack([h[j] for h in inner])[np.arange(len(keys))[:, None], cs0] for j in (0, 1))
    B, Bf = (np.stack([h[j] for h in below])[np.arange(len(keys))[:, None], cs0] for j in (0, 1))
    d = np.where(real, cls.gpus[cs0], 0)[:, :, None, None]
    cap = np.array([gpu_caps[g] for g, _ in keys])[:, None, None, None]
    s_idx, span, s_c, lo, hi, top, e1 = _index_grids(K)
    zero = np.zeros(A.shape[:2] + (1,), np.int64)
    pre = np.concatenate([zero, np.cumsum(A, axis=2)], axis=2)  # [P, C, K+1]
    zer = np.concatenate([zero, np.cumsum(A < 1, axis=2)], axis=2)
    ok = real[:, :, None, None] & (span >= 1) & (span * d <= cap) & (s_idx < K)  # [P, C, K+1, K+1]
    Bs, Bfs = B[:, :, s_c], Bf[:, :, s_c]
    val = np.where(ok & (Bs >= 1) & (zer[:, :, hi] - zer[:, :, lo] == 0), Bs + pre[:, :, hi] - pre[:, :, lo], NEG)
    Afe = Af[:, :, e1]
    two = Bs + pre[:, :, top] - pre[:, :, lo] + Afe
    valf = np.where(span == 1, np.where(Bfs >= 1, Bfs, NEG),
                    np.where((Bs >= 1) & (zer[:, :, top] - zer[:, :, lo] == 0) & (Afe >= 1), two, NEG))
    valf = np.where(ok, valf, NEG)
    seg, segf = val.max(axis=1), valf.max(axis=1)  # the first class reaching the most (one at a time: strict >)
    pick = np.arange(len(keys))[:, None, None]
    arg = np.where(seg > NEG, cs[pick, val.argmax(axis=1)], -1)
    argf = np.where(segf > NEG, cs[pick, valf.argmax(axis=1)], -1)
    pad = np.full((1, K + 1, K + 1), NEG, np.int32)
    tab = tuple(np.concatenate([x.transpose(0, 2, 1).astype(np.int32), pad]) for x in (seg, segf))
    return SegmentTable(tab, arg, argf, at)


_GRIDS: dict = {}


def _index_grids(K: int) -> tuple:
    """The [K+1, K+1] index arrays of ``segment_table`` by (s, e): s, the span e - s, s clipped to a slot, the first
    slot above s (lo), e raised to lo (hi), e - 1 raised to lo (top), e - 1 clipped to a slot (each K once)."""
    if K not in _GRIDS:
        s_idx, e_idx = np.meshgrid(np.arange(K + 1), np.arange(K + 1), indexing="ij")
        lo = np.minimum(s_idx + 1, K)
        _GRIDS[K] = (s_idx, e_idx - s_idx, np.minimum(s_idx, K - 1), lo, np.maximum(e_idx, lo),
                     np.maximum(e_idx - 1, lo), np.clip(e_idx - 1, 0, K - 1))
    return _GRIDS[K]


def coverage(t: Tables, cls: Classes, caps_at: CapCache, gpu_caps, tau: float, max_segments: int,
             charge: np.ndarray) -> dict:
    """Best structure per stage count P: {P: (layers, [(group, class, s, e), ...] from slot 1 up)}.
    GPU groups form contiguous segments in any order (eq. DP3): a DP over (set of groups used,
    group of the topmost segment) with back pointers. ``charge``: the links' budget charges (module doc).
    One level (segment count) at a time, every state and group together (``_level``); ties go to the earlier state
    and the lower group, as one pair at a time in that order would."""
    groups = sorted({int(g) for g in cls.group})
    if not groups:
        return {}
    segs = segment_table(t, cls, caps_at, gpu_caps, tau, groups, charge)
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
        si, gi, (valf, sf), (val, sv) = _level([keys[i] for i in frontier], [states[keys[i]][0] for i in frontier],
                                               groups, segs)
        cand = np.where((valf >= t.L) & (np.arange(K1) <= t.L), valf, NEG)  # [pairs, K+1]
        pick = cand.argmax(axis=0)  # the first pair reaching the most
        top = cand[pick, np.arange(K1)]
        for e in np.flatnonzero(top > best_val):
            r = int(pick[e])
            best_val[e], best_at[e] = top[e], (keys[frontier[si[r]]], groups[gi[r]], int(sf[r, e]))
        new, F2, below, s_at = _new_states(keys, frontier, groups, si, gi, val, sv)
        for k, nk in enumerate(new):
            states[nk] = (F2[k], below[k], s_at[k])
        live = np.flatnonzero((F2 > NEG // 2).any(axis=1))
        nxt = (len(keys) + _beam(F2[live], live, t.L, max(1, BEAM_PAIRS // len(groups)))).tolist()
        keys += new
        frontier = nxt
    out = {}
    for p in np.flatnonzero(best_val > NEG).tolist():
        key, g, s = best_at[p]
        structure = [(g, int(segs.classes(g, key[1], first=True)[s, p]), s, p)]
        e = s
        while key != (0, -1):
            _, prev, s_arr = states[key]
            s_prev = int(s_arr[e])
            pkey = keys[int(prev[e])]
            structure.append((key[1], int(segs.classes(key[1], pkey[1], first=False)[s_prev, e]), s_prev, e))
            key, e = pkey, s_prev
        out[p] = (int(best_val[p]), structure[::-1])
    return out


def _beam(F: np.ndarray, ids: np.ndarray, L: int, most: int) -> np.ndarray:
    """Eq. DP3c: of a level's live states (``ids``, their layers ``F`` [states, K+1]) at most ``most`` go on, those
    that hold the most layers summed over the slot counts (each count's capped at L), ties to the earlier state. The
    states grow as C(G, k) k with G groups and k segments, and each is extended by every group it lacks, so on many
    islands the level neither fits in memory nor ends (16 groups: 48,048 states at the sixth segment; 64 groups: a
    26 GiB array). ``most`` is BEAM_PAIRS / G: with up to 8 groups (280 states at most, every benchmark instance)
    every state goes on and the plans are the same."""
    if len(ids) <= most:
        return ids
    score = np.clip(F, 0, L).sum(axis=1)
    return np.sort(ids[np.argsort(-score, kind="stable")[:most]])


def _new_states(keys: list, frontier: list, groups: list, si, gi, val, sv):
    """The states one level up: each pair (state si, group gi) leads to (set | g, g). Returns the new states in the
    order of their first pair and, [new states, K+1] by slot e, their layers (the most of their pairs), the state below
    and the s of the pair reaching that (the first of its pairs that does, as one pair at a time in order would). All
    pairs at once: a stable sort by new state, then a max and a first hit per run."""
    g_arr = np.asarray(groups, np.int64)[gi]
    used = np.array([keys[i][0] for i in frontier], np.int64)[si] | (np.int64(1) << g_arr)
    _, first, inv = np.unique(used * (max(groups) + 1) + g_arr, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    gid = rank[inv.ravel()]  # new state per pair, numbered by first pair
    perm = np.argsort(gid, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(gid[perm]) != 0])
    V = val[perm]
    best = np.maximum.reduceat(V, starts, axis=0)  # [new states, K+1]
    pos = np.where(V == best[gid[perm]], np.arange(len(perm))[:, None], len(perm))
    at = perm[np.minimum.reduceat(pos, starts, axis=0)]  # [new states, K+1] the pair reaching it first
    below = np.asarray(frontier, np.int64)[si[at]]
    first_pairs = perm[starts]
    new = list(zip(used[first_pairs].tolist(), g_arr[first_pairs].tolist()))
    return new, np.maximum(best, NEG), below, sv[at, np.arange(val.shape[1])[None, :]]


def _level(keys: list, Fs: list, groups: list, segs: SegmentTable):
    """One segment more on each state (set bits, last) with layers F [K+1] on slots 1..s, for each group g not in its
    set: the most layers up to slot e with g's segment on slots s+1..e, and the first s reaching it. Returns the pairs
    (state index [pairs], group index [pairs], state-major) and, per pair, ([pairs, K+1] layers, [pairs, K+1] s) for
    a final segment (``segf``) and a non-final one. Int32 with s innermost: the reduction runs over contiguous
    memory (the sums stay >= 2 NEG)."""
    F = np.stack(Fs).astype(np.int32)  # [S, K+1]
    ok = np.array([[not used >> g & 1 for g in groups] for used, _ in keys])
    si, gi = np.nonzero(ok)
    rows = segs.at[np.array([last + 1 for _, last in keys])[si], np.asarray(groups)[gi]]  # [pairs] table rows
    out = []
    for part in (1, 0):  # segf, then seg; the table's rows [pair, e, s]
        tot = F[si][:, None, :] + segs.tab[part][rows]  # [pairs, e, s]
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
