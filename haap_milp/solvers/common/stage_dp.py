"""Lower bound of a (variant, tau interval) node by a DP over the pipeline's stages (eq. N4,
formulations/README.md), with the GPU counts moved into the objective by Lagrange multipliers.

At a fixed steady period the objective T = (M - 1) tau + sum t + sum c + sigma (eq. T1) splits: a node
has tau >= a, and every plan of it with t_j <= b (the tables' layer bounds, eq. X1) pays

    T >= (M - 1) a + sum_j t_j + sum_j c_j + s_0          (sigma >= s_0, eq. T3)

The right side is a sum over stages and links, so the least of it over all pipelines is a shortest path:
slots k = 1 .. P from the end (k = 1 the last stage), state (layers held by slots 1..k, endpoint of slot k),
a stage at slot k with option i and n layers in [lo, U] (memory at its slot, eqs. M2, D1, X1), a link
p2p[e, f] from the earlier stage's endpoint to the later one's (none slower than 2b, eq. T2). Only the GPU
rows (G1) couple the stages; with multipliers mu_g >= 0 (s per GPU) for them,

    LB(mu) = (M - 1) a + min_path [ sum_j (t_j + mu . gpus_j) + sum_j c_j + s_0 ] - mu . cap

is a lower bound on every plan of the node for every mu >= 0 (weak duality); the in-flight rows of eq.
T2, sigma's later terms and the engine rule U2 are left out, which only lowers it (U1: one DP per
signature, by the caller). The DP's state is the slot's p2p *endpoint* (``Tables.group``: a group, or a
mixed option's own row of ``p2p_time``, eq. H5; any other endpoint presolve gives an option works alike), so
links are priced exactly between endpoints; ``usage[i]`` is what option i takes of each group (``Tables.use``):
the multipliers price that row, so an option whose replicas draw from several groups is priced right. mu is
improved by projected subgradient steps (one group: bisection), warm-started from the parent node. A path
that fits every group's GPUs is a plan (it is offered as an incumbent once checked).

Two more terms (formulations/README.md): eq. N7 prices the in-flight rows of eq. T2 by slot weights (off by default:
measured no gain), and eq. N8 (``sigma_dp.sigma_bound``) adds sigma's later rows (eq. T3) by cases on their bottleneck per
stage count, for pruning against the incumbent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from haap_milp.pipeline import TIME_RTOL
from haap_milp.problem import Assignment, Problem, Stage
from haap_milp.solvers.common.slot_bounds import Tables, link_half

INF = math.inf
MAX_STEPS = 12  # DP evaluations per node (each 1-10 ms); warm-started from the parent's multipliers
NU_STEPS = 0  # eq. N7: DP evaluations on the in-flight multipliers after the GPU ones (0: off; measured no gain, formulations)
POOLED_STEPS = 8  # DP runs on one multiplier shared by every group when the subgradient leaves a group overfilled
PAIR_WINDOW = True  # eq. N29: links that eq. T2's window of their two stages rules out at the node's b are unusable
# eq. N29b: a stage that sends over a link e -> f takes at most 2b - c(e, f) - tmin[f] (eq. T2's window of the pair)
SENDER_CAP = True
MU_RTOL = 1e-3  # one group: bisection on mu stops when the bracket is this narrow (relative)
SLOT_BLOCK = 1 << 20  # eq. N4c: entries of one [slots, n, L+1] block of stage tables (8 MB)
BASE_CACHE = 1 << 21  # eq. N4c: the non-first tables kept when all of them hold at most this many entries (16 MB)


def _blocks(ks: list[int], size: int) -> list[list[int]]:
    return [ks[i:i + size] for i in range(0, len(ks), size)]


def _frozen(a: np.ndarray) -> np.ndarray:
    """``a`` made read-only (a table callers share)."""
    a.flags.writeable = False
    return a


def sync_parts(coef: dict, first: bool, last) -> tuple[np.ndarray, np.ndarray]:
    """A stage's DP sync s_j = per * n + const at n layers, from the slot tables' coefficients (``Tables.coef``): (per
    [n_opts], const) with ``sync_first`` on the first stage and ``sync_last`` where ``last`` (a bool, or a [slots, 1]
    mask, which makes const [slots, n_opts])."""
    const = coef["sync_fixed"] + coef["sync_first"] if first else coef["sync_fixed"]
    return coef["sync_per_layer"], np.where(last, const + coef["sync_last"], const)


def inflight_cap(k: int, b: float) -> float:
    """Eq. N10: the most slots 1..k's times and links may add up to under eq. T2's in-flight row k (<= k tau) at
    tau <= b, s, within float noise (every in-flight cut of the DPs compares against this)."""
    return k * b * (1 + 1e-9) + 1e-12


@dataclass
class PathResult:
    """One DP evaluation: the least Lagrangian path cost (s, before subtracting mu . cap), its GPUs per
    group and the path itself (slot P first)."""

    cost: float
    used: np.ndarray  # [R]: GPUs per group, then the scaled budget row when there is one
    stages: tuple[tuple[int, int], ...]  # (local option, layers) in pipeline order


@dataclass
class NodeBound:
    bound_s: float  # lower bound on T over the node (inf: no plan)
    mu: np.ndarray  # multipliers reached (warm start for the children)
    plan: Assignment | None = None  # a path within every group's GPUs (memory, GPUs and tau <= b hold)
    steps: int = 0
    used: np.ndarray | None = None  # GPUs per group of the least path at ``mu``
    nu: np.ndarray | None = None  # eq. N7's in-flight multipliers reached (with ``mu``)
    # eq. N16: [k_max + 1] per stage count P the best Lagrangian bound on the node's plans of exactly P stages over
    # every DP run made (inf where P is outside the node's range or has no path; None: not tracked)
    per_p: np.ndarray | None = None


def link_usable(p2p: np.ndarray, b: float, vpp: int = 1) -> np.ndarray:
    """Links a plan of tau <= b may take between two neighbouring stages: every plan has tau >= c/2 for each of its
    links (eq. T2), an interleaved one tau >= vpp c/2 (eq. I2: each direction carries vpp transfers of c/2 per
    micro-batch; the wrap, last stage to first, only vpp - 1: not a neighbour link, see ``model._wrap``)."""
    return link_half(p2p, vpp) <= b * (1 + TIME_RTOL)


def pair_window_usable(t: Tables, b: float, k_max: int) -> np.ndarray:
    """Eq. N29: [E, E] links a plan of tau <= b may take under eq. T2's window of the two stages beside it, t_j +
    t_{j+1} + c_j <= 2 tau, with each stage at least one layer of its endpoint's fastest option (``tmin``): c <= 2b -
    tmin[e] - tmin[f]. Holds where the sender has a steady phase (P - j < M; every slot when k_max < M) under 1F1B
    (eq. T2b implies the windows under blocking sends); all True elsewhere (interleaving: eq. I3's rows instead)."""
    E = int(t.p2p.shape[0])
    if not _windows_hold(t, k_max):
        return np.ones((E, E), bool)
    tmin = _tmin(t)
    return t.p2p + tmin[:, None] + tmin[None, :] <= 2 * b * (1 + TIME_RTOL)


def _windows_hold(t: Tables, k_max: int) -> bool:
    """Eq. T2's pair windows bind every link of the node's plans: 1F1B (vpp 1), every slot with a steady phase
    (k_max < M), some option."""
    return t.vpp <= 1 and t.M > k_max and bool(t.n)


def _tmin(t: Tables) -> np.ndarray:
    """[E] the least one-layer time of an option at each endpoint (inf: none): no stage there takes less."""
    tmin = np.full(int(t.p2p.shape[0]), INF)
    np.minimum.at(tmin, np.asarray(t.group, np.int64), np.asarray(t.coef["layer_time"], float))
    return tmin


def sender_caps(t: Tables, b: float, k_max: int, link: np.ndarray):
    """Eq. N29b: the links whose pair window caps their sender below b, as (slow [E, E] mask, gs [S] senders, hs [S]
    receivers, cap [S]); None when there is none. A plan of tau <= b with stage j at endpoint g sending to stage j + 1
    at h has t_j <= 2 tau - c(g, h) - t_{j+1} <= 2b - c(g, h) - tmin[h] (eq. T2's window of the two, ``pair_window_
    usable``'s conditions: 1F1B, every slot with a steady phase). Only links the node may take (``link`` finite)."""
    if not _windows_hold(t, k_max) or k_max < 2 or not math.isfinite(b):
        return None
    cap = 2 * b * (1 + TIME_RTOL) - t.p2p - _tmin(t)[None, :]
    slow = np.isfinite(link) & (cap < b)
    if not slow.any():
        return None
    gs, hs = np.nonzero(slow)
    return slow, gs, hs, cap[gs, hs]


class PathDP:
    """The node's stage costs without the multipliers, built once per node ([n, L+1] per slot: the time
    terms of a stage of n layers, inf where memory, eq. D1, X1 or the GPUs the other stages need forbid
    it); ``run(mu)`` is one DP evaluation."""

    def __init__(self, problem: Problem, t: Tables, b: float, p_lo: int, p_hi: int, keep: np.ndarray | None = None):
        """``keep``: the local options the paths may use (one uniform signature under eq. U1; default all)."""
        self.t, self.L, self.G, self.b = t, t.L, len(problem.groups), b
        self.E = int(t.p2p.shape[0])  # p2p endpoints: the DP's state (a group, or a mixed option's own row, eq. H5)
        self.keep = np.ones(t.n, bool) if keep is None else keep
        # True while eq. N12 (dual_bundle.GpuTimeRows.priced) has raised the stage costs beyond time and links: then
        # no state's cost is a pure time, and eq. N10's in-flight cut must not run
        self.extra_priced = False
        # the rows the multipliers price: [n, R] GPUs of each group (slot_bounds' usage matrix), then the budget
        # row W1 when there is one, scaled to the GPUs' magnitude (a row's scale does not change its Lagrangian
        # bound, only the subgradient's conditioning); ``cap`` [R] their right-hand sides
        self.usage, self.cap = _resources(problem, t)
        # [e earlier, f later]; an interleaved variant pays vpp * c per link (eq. I1)
        self.k_max = min(p_hi, t.p_max)
        usable = link_usable(t.p2p, b, t.vpp) & (pair_window_usable(t, b, self.k_max) if PAIR_WINDOW else True)
        self.link = np.where(usable, t.p2p * (float(t.vpp) if t.vpp > 1 else 1.0), INF)
        # eq. N29b: the slow links (their sender capped below b), pairs s = (gs[s] -> hs[s]); per pair the sender's
        # rows ([S, W], padded with the extra row), and per sender endpoint its pairs ([E, Smax], padded with S)
        self._slow = sender_caps(t, b, self.k_max, self.link) if SENDER_CAP else None
        self._first_cap: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.p_first = max(p_lo, t.p_min)
        # options with the same footprint (endpoint, GPUs taken of each group) pay the same multipliers, so per slot
        # and layer count the DP needs only the cheapest of them: one row per footprint, and which option it is
        # (measured: 1278 MoE options, 48 footprints)
        foot = np.column_stack([t.group, self.usage])
        _, self._row_of = np.unique(foot, axis=0, return_inverse=True)
        self._row_of = self._row_of.reshape(-1)
        self._order = np.argsort(self._row_of, kind="stable")
        self._starts = np.flatnonzero(np.r_[True, np.diff(self._row_of[self._order]) != 0])
        first_of_row = self._order[self._starts]
        self.row_usage, self.row_group = self.usage[first_of_row], t.group[first_of_row]  # row_group: its endpoint
        self.members = [np.flatnonzero(self.row_group == e) for e in range(self.E)]
        width = max([len(m) for m in self.members] + [1])
        self._pad = np.full((self.E, width), len(self.row_group), np.int64)  # (_per_group)
        for e, m in enumerate(self.members):
            self._pad[e, :len(m)] = m
        if self._slow is not None:
            gs = self._slow[1]
            self._slow_rows = self._pad[gs]
            per = [np.flatnonzero(gs == e) for e in range(self.E)]
            self._slow_of = np.full((self.E, max(len(x) for x in per)), len(gs), np.int64)
            for e, x in enumerate(per):
                self._slow_of[e, :len(x)] = x
        cap = np.asarray(problem.group_capacity, float)
        # GPUs the other stages take at least, against what the stage leaves: k others (slots 1..k-1 and one
        # earlier, or P - 1 of them for the first stage), each of dmin GPUs; of the groups the stage draws from
        # (its own, or a mixed option's several) only what it leaves is free for them
        mine = t.use > 0  # [n, G]
        self._dmin = float(t.gpus.min())
        self._cap = (mine * cap).sum(axis=1)  # capacity of the stage's own groups
        self._other = cap.sum() - self._cap
        # eq. N7: the in-flight rows j = 1 .. J of eq. T2 (j < M; none for an interleaved variant, eq. I3)
        self.J = min(t.M - 1, self.k_max) if t.vpp <= 1 else 0
        # per slot k: ([rows, L+1] least cost, [rows, L+1] the option reaching it); a first stage's time and sync
        # parts kept apart as well (eq. N7 weighs only the time)
        # eq. N4c: the slots' stage tables computed SLOT_BLOCK slots at a time ([slots, n, L+1] arrays) and, where
        # they are small, the non-first ones kept for ``_base``'s later callers (eqs. N8, N12)
        nf = list(range(1, self.k_max))
        self._nf_base: dict[int, np.ndarray] = {}
        keep_nf = len(nf) * self.t.n * (self.L + 1) <= BASE_CACHE
        self.nonfirst = {}
        for ks in _blocks(nf, self._block()):
            tm, _ = self._base_block(ks, False)
            least, opt = self._rows(tm)
            for j, k in enumerate(ks):
                self.nonfirst[k] = (least[j], opt[j])
                if keep_nf:
                    self._nf_base[k] = _frozen(tm[j])
        self._first_parts, self.first = {}, {}
        for ks in _blocks(list(range(self.p_first, self.k_max + 1)), self._block()):
            tm, sy = self._base_block(ks, True)
            least, opt = self._rows(tm + sy)
            for j, k in enumerate(ks):
                self._first_parts[k] = (_frozen(tm[j]), _frozen(sy[j]))
                self.first[k] = (least[j], opt[j])

    def _block(self) -> int:
        """Slots per ``_base_block`` call: [slots, n, L+1] arrays of at most SLOT_BLOCK entries (one slot at least)."""
        return max(1, SLOT_BLOCK // max(self.t.n * (self.L + 1), 1))

    def _rows(self, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[n, L+1] per option -> ([rows, L+1] least per footprint, [rows, L+1] option reaching it); the same over
        a leading axis of slots ([slots, n, L+1] -> [slots, rows, L+1] each)."""
        ax = cost.ndim - 2  # (the option axis)
        srt = np.take(cost, self._order, axis=ax)
        least = np.minimum.reduceat(srt, self._starts, axis=ax)
        who = np.arange(srt.shape[ax])[:, None]
        pos = np.where(srt == np.take(least, self._row_of[self._order], axis=ax), who, srt.shape[ax])
        return least, self._order[np.minimum.reduceat(pos, self._starts, axis=ax)]

    def _base(self, k: int, first: bool, parts: bool = False):
        """[n, L+1] stage cost at slot k (t_j, plus s_0 for the first stage); ``parts``: (time, sync) apart. The
        arrays kept at set-up are returned as they are (read-only)."""
        if first and k in self._first_parts:
            tm, sy = self._first_parts[k]
        elif not first and k in self._nf_base:
            tm, sy = self._nf_base[k], None
        else:
            tm, sy = (a[0] for a in self._base_block([k], first))
        if parts:
            return tm, (sy if sy is not None else np.zeros_like(tm))
        return tm + sy if first else tm

    def _base_block(self, ks: list[int], first: bool) -> tuple[np.ndarray, np.ndarray]:
        """([slots, n, L+1] time, sync) of ``_base`` at the slots ``ks`` at once (the sync zero for non-first)."""
        t, c, L = self.t, self.t.coef, self.L
        k = np.asarray(ks)[:, None]  # [slots, 1]
        n = np.arange(L + 1, dtype=float)[None, None, :]
        ts = 1.0 / t.vpp if t.vpp > 1 else 1.0  # eq. I1: an interleaved variant pays sum t / vpp
        per_t, const_t = c["layer_time"] * ts, np.zeros(t.n)
        if first:
            const_t += c["first_time"] * ts
        last = k == 1  # [slots, 1]: slot 1 also pays the last stage's terms
        const_t = np.where(last, const_t + c["last_time"] * ts, const_t)  # [slots, n]
        # (a non-first stage's sync is not priced here: zero)
        per_s, const_s = sync_parts(c, True, last) if first else (np.zeros(t.n), np.zeros(const_t.shape))
        lo, up = (t.lof, t.Uf) if first else (t.lo, t.U)
        others = (k - 1 if first else k) * self._dmin  # [slots, 1]
        fits = t.gpus + np.maximum(0.0, others - self._other) <= self._cap  # [slots, n]
        ok = (n >= np.maximum(lo[k[:, 0] - 1], 1)[:, :, None]) & (n <= up[k[:, 0] - 1][:, :, None]) \
            & (fits & self.keep)[:, :, None]
        tm = np.where(ok, n * per_t[None, :, None] + const_t[:, :, None], INF)
        sy = np.where(ok, n * per_s[None, :, None] + const_s[:, :, None], 0.0)
        return tm, sy

    def slot_weights(self, nu: np.ndarray | None) -> np.ndarray:
        """Eq. N7: [k_max + 1] the weight of slot k's time and of its link to slot k - 1, 1 + sum_{k <= j <= J} nu_j
        (index 0 unused)."""
        w = np.ones(self.k_max + 1)
        if nu is not None and self.J and np.any(nu):
            tail = np.cumsum(nu[: self.J][::-1])[::-1]  # tail[j - 1] = sum_{j' >= j} nu_j'
            w[1: self.J + 1] += tail
        return w

    def tau_term(self, a: float, b: float, nu: np.ndarray | None) -> float:
        """Eq. N7: the least of (M - 1 - sum_j j nu_j) tau over tau in [a, b] ((M - 1/vpp) a without nu)."""
        if nu is None or not self.J or not np.any(nu):
            return self.t.tau_weight * a
        coef = self.t.tau_weight - float(np.arange(1, self.J + 1) @ nu[: self.J])
        return min(coef * a, coef * b)

    def weighted(self, nu: np.ndarray | None):
        """(first, nonfirst, link per slot) with eq. N7's weights: the stage tables of ``first`` / ``nonfirst``
        and [k] -> the [E, E] link costs entering slot k from slot k - 1 (weight w_k)."""
        w = self.slot_weights(nu)
        if np.all(w == 1.0):
            return self.first, self.nonfirst, {k: self.link for k in range(2, self.k_max + 1)}
        nonfirst = {k: (least * w[k], opt) for k, (least, opt) in self.nonfirst.items()}
        first = {k: self._rows(w[k] * tm + sy) if w[k] != 1.0 else self.first[k]
                 for k, (tm, sy) in self._first_parts.items()}
        return first, nonfirst, {k: self.link * w[k] for k in range(2, self.k_max + 1)}

    def prefix(self, stages) -> np.ndarray:
        """[J] S_j of eq. N7 for a path (pipeline order): slots 1..min(j, P)'s times and the links between them."""
        t, c = self.t, self.t.coef
        ts = 1.0 / t.vpp if t.vpp > 1 else 1.0
        P = len(stages)
        vals = []  # slot k = 1 .. P: its time plus its link to slot k - 1
        for k in range(1, P + 1):
            i, n = stages[P - k]
            tk = n * c["layer_time"][i] * ts + (c["first_time"][i] * ts if k == P else 0.0) + \
                (c["last_time"][i] * ts if k == 1 else 0.0)
            if k > 1:
                tk += self.link[int(t.group[i]), int(t.group[stages[P - k + 1][0]])]
            vals.append(float(tk))
        s = np.cumsum(vals)
        return s[np.minimum(np.arange(self.J), P - 1)] if self.J else np.zeros(0)

    def _per_group(self, cost: np.ndarray, opt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Least cost per (endpoint, n) over rows and the option reaching it: [E, L+1] each (the first least row of
        an endpoint; an endpoint without rows: inf, option 0)."""
        pad = self._pad  # [E, R] the endpoint's rows, padded with the extra row len(cost) (inf, option 0)
        n1 = cost.shape[1]
        cost_x = np.empty((cost.shape[0] + 1, n1))
        cost_x[:-1] = cost
        cost_x[-1] = INF
        sub = cost_x[pad]  # [E, R, L+1]
        j = sub.argmin(axis=1)
        rows = pad[np.arange(self.E)[:, None], j]  # [E, L+1]
        cols = np.arange(n1)[None, :]
        opt_rows = np.minimum(rows, cost.shape[0] - 1)  # (the padding row's option: 0)
        argI = np.where(rows < cost.shape[0], opt[opt_rows, cols], 0).astype(np.int64)
        return cost_x[rows, cols], argI

    def per_p(self, shift: float, acc: np.ndarray | None = None) -> np.ndarray:
        """Eq. N16: the last run's least path cost per stage count P (``per_first``) plus ``shift`` (the run's
        multiplier terms: its bound less its path cost), as [k_max + 1] (inf outside the node's range), the elementwise
        max with ``acc`` when given. Each entry bounds the node's plans of exactly P stages (the path of P stages
        is a relaxation of them, at any multipliers), so the max over runs does too."""
        out = np.full(self.k_max + 1, INF)
        for k, c in self.per_first.items():
            if k <= self.k_max:
                out[k] = c + shift
        return out if acc is None else np.maximum(acc, out)

    def _first_capped(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Eq. N29b at a first stage (slot k) sending over slow pair s: ([S, W, L+1] least time + sync per row of
        the sender's endpoint (``_slow_rows``) over its options whose time (not sync) is within the pair's cap, inf
        where none is; [S, W, L+1] the option reaching it). Kept per slot (independent of the multipliers)."""
        got = self._first_cap.get(k)
        if got is not None:
            return got
        _, gs, _, caps = self._slow
        tm, sy = self._first_parts[k]
        S, W = self._slow_rows.shape
        least, opt = np.full((S, W, self.L + 1), INF), np.zeros((S, W, self.L + 1), np.int64)
        for g in np.unique(gs):
            mine = np.flatnonzero(gs == g)
            idx = self._order[self.t.group[self._order] == g]  # the endpoint's options, by row
            if not len(idx):
                continue
            rows = self._row_of[idx]
            starts = np.flatnonzero(np.r_[True, np.diff(rows) != 0])  # one per row of g, as ``members[g]``
            tg = tm[idx][None]  # [1, n_g, L+1]
            c = np.where(tg <= caps[mine][:, None, None], tg + sy[idx][None], INF)  # [S_g, n_g, L+1]
            lst = np.minimum.reduceat(c, starts, axis=1)  # [S_g, rows of g, L+1]
            who = np.arange(len(idx))[None, :, None]
            pos = np.where(c == np.repeat(lst, np.diff(np.r_[starts, len(idx)]), axis=1), who, len(idx))
            arg = np.minimum(np.minimum.reduceat(pos, starts, axis=1), len(idx) - 1)
            nr = len(starts)
            least[mine, :nr] = lst
            opt[mine, :nr] = idx[arg]
        got = (_frozen(least), _frozen(opt))
        self._first_cap[k] = got
        return got

    def run(self, mu: np.ndarray, nu: np.ndarray | None = None, tables=None) -> PathResult | None:
        """The least Lagrangian path over the node's stage counts (None: no path); ``nu``: eq. N7's multipliers;
        ``tables``: (first, nonfirst, k_max) in place of the node's (eq. N8: one stage count, thresholds)."""
        L, E = self.L, self.E
        first_t, nonfirst_t, links = self.weighted(nu)
        k_max = self.k_max
        self.per_first = {}  # P -> the least path cost with its first stage at slot P (eq. N8 reads it)
        # eq. N29b: the sender caps, where the stage costs are the pure stage times (no eq. N7 weights, N12 prices or
        # eq. N8 thresholds); the slow pairs then leave the plain links and are taken apart with their capped stages
        capped = self._slow is not None and tables is None and not self.extra_priced \
            and first_t is self.first and nonfirst_t is self.nonfirst
        if tables is not None:
            first_t, nonfirst_t, k_max = tables
        if capped:
            slow, gs, hs, _ = self._slow
            plain = np.where(slow, INF, self.link)
            links = dict.fromkeys(links, plain)
            S = len(gs)
            mu_x = np.append((self.row_usage @ mu), 0.0)[self._slow_rows]  # [S, W] (the padding row: inf costs)
        mu_cost = (self.row_usage @ mu)[:, None]
        lidx = np.arange(L + 1)
        # [l, n] -> l - n, or L + 1 (a column of inf appended to the later part) where n > l
        conv_idx = np.where(lidx[:, None] >= lidx[None, :], lidx[:, None] - lidx[None, :], L + 1)
        F = None  # [E, L+1]: slots 1..k-1 non-first, slot k-1 at endpoint e, l layers held
        # per slot k: (argI [E, L+1], argN [E, L+1], argH [E, L+1] or None, eq. N29b's overrides or None)
        trace = []
        best = (INF, None)
        Hx = np.empty((E, L + 2))
        Hx[:, L + 1] = INF
        for k in range(1, k_max + 1):
            FS = None  # eq. N29b: [S, L+2] the later part via slow pair s (F at its receiver plus the link)
            if F is not None:  # H[e, m]: the best later part when slot k is at endpoint e
                Hgh = F[None, :, :] + links[k][:, :, None]  # [g, h, m]
                argH = Hgh.argmin(axis=1)
                H = np.take_along_axis(Hgh, argH[:, None, :], axis=1)[:, 0, :]
                if capped:
                    FS = np.full((S, L + 2), INF)
                    FS[:, :L + 1] = F[hs] + self.link[gs, hs][:, None]
            else:
                H, argH = None, None
            if k in first_t:  # the first stage at slot k (P = k)
                if H is None:
                    rest = np.full(L + 1, INF)
                    rest[L] = 0.0
                    rest = rest[None, :]
                else:
                    rest = H[self.row_group][:, L - lidx]  # layers left for slots 1..k-1 (none left: inf)
                cost, opt = first_t[k]
                tot = cost + mu_cost + rest
                flat = int(np.argmin(tot))
                val = float(tot.flat[flat])
                at = None
                if val < best[0]:
                    row, n = divmod(flat, L + 1)
                    at = (k, int(opt[row, n]), n, int(argH[self.row_group[row], L - n]) if H is not None else -1)
                if FS is not None:  # its time within the cap of a slow link to slot k - 1
                    fl, fo = self._first_capped(k)
                    totS = fl + mu_x[:, :, None] + FS[:, None, L - lidx]  # [S, W, L+1]
                    flatS = int(np.argmin(totS))
                    if totS.flat[flatS] < val:
                        val = float(totS.flat[flatS])
                        s_, w_, n = np.unravel_index(flatS, totS.shape)
                        at = (k, int(fo[s_, w_, n]), int(n), int(hs[s_]))
                self.per_first[k] = val
                if val < best[0]:
                    best = (val, at)
            if k >= k_max:
                break
            cost, opt = nonfirst_t[k]
            cb, argI = self._per_group(cost + mu_cost, opt)  # [E, L+1]
            over = None
            if H is None:
                F, argN = cb, np.broadcast_to(lidx, (E, L + 1)).copy()
            else:
                # only the layer counts some option may hold at slot k (measured: 13-18 of 81 on three types x two
                # islands), so the min-plus convolution is [g, l, those n] instead of [g, l, L+1]
                ns = np.flatnonzero(np.isfinite(cost).any(axis=0))
                if len(ns) == 0:
                    F, argN = np.full((E, L + 1), INF), np.zeros((E, L + 1), np.int64)
                else:
                    Hx[:, :L + 1] = H
                    tens = cb[:, None, ns] + Hx[:, conv_idx[:, ns]]  # [g, l, n]
                    j = tens.argmin(axis=2)
                    F = np.take_along_axis(tens, j[:, :, None], axis=2)[:, :, 0]
                    argN = ns[j]
                    if FS is not None:
                        F, over = self._slow_step(F, FS, cost[:, ns], opt, ns, conv_idx, mu_x)
            trace.append((argI, argN, argH, over))
        if not math.isfinite(best[0]):
            return None
        return _backtrack(self.t, self.usage, best, trace)

    def _slow_step(self, F, FS, time, opt, ns, conv_idx, mu_x):
        """Eq. N29b at a non-first slot k: the stage at endpoint g sending over slow pair s = (g, h) holds only rows
        and layer counts whose time (the stage cost here: the least time of the row's options, so a row has an option
        within the cap exactly where this is) is within the pair's cap; F (from the plain links) lowered where such a
        path is cheaper, and the overrides of the trace there ([E, L+1] mask, layers, option, receiver). Only the
        pairs and layer counts with some finite capped stage and later part enter the min-plus convolution."""
        _, gs, hs, caps = self._slow
        R = time.shape[0]
        tx = np.full((R + 1, len(ns)), INF)
        tx[:R] = time
        sub = tx[self._slow_rows]  # [S, W, n]
        sub = np.where(sub <= caps[:, None, None], sub + mu_x[:, :, None], INF)
        w = sub.argmin(axis=1)  # [S, n]
        cbS = np.take_along_axis(sub, w[:, None, :], axis=1)[:, 0, :]
        fin = np.isfinite(cbS)
        live = np.flatnonzero(fin.any(axis=1) & np.isfinite(FS).any(axis=1))
        if not len(live):
            return F, None
        cols = np.flatnonzero(fin[live].any(axis=0))
        cbS, ns_s = cbS[live][:, cols], ns[cols]
        rowS = self._slow_rows[live[:, None], w[live][:, cols]]  # [S', n']
        tens = cbS[:, None, :] + FS[live][:, conv_idx[:, ns_s]]  # [S', l, n']
        j = tens.argmin(axis=2)  # [S', l]
        FSl = np.full((len(gs) + 1, F.shape[1]), INF)  # (row S: the padding of ``_slow_of``)
        FSl[live] = np.take_along_axis(tens, j[:, :, None], axis=2)[:, :, 0]
        cand = FSl[self._slow_of]  # [E, Smax, l]
        jj = cand.argmin(axis=1)
        Fs = np.take_along_axis(cand, jj[:, None, :], axis=1)[:, 0, :]
        better = Fs < F
        if not better.any():
            return F, None
        lidx = np.arange(F.shape[1])[None, :]
        s = self._slow_of[np.arange(self.E)[:, None], jj]  # [E, l] the pair (S where none: never better)
        at = np.zeros(len(gs) + 1, np.int64)
        at[live] = np.arange(len(live))
        pos = j[at[s], lidx]  # [E, l] position in ns_s
        n = ns_s[pos]
        row = np.minimum(rowS[at[s], pos], R - 1)
        return np.where(better, Fs, F), (better, n, opt[row, n], hs[np.minimum(s, len(gs) - 1)])


def _backtrack(t: Tables, usage: np.ndarray, best, trace) -> PathResult:
    cost, (P, i, n, h) = best  # h: slot P - 1's endpoint
    stages = [(int(i), int(n))]
    used = usage[i].copy()
    left = t.L - n
    for k in range(P - 1, 0, -1):
        argI, argN, argH, over = trace[k - 1]
        if over is not None and over[0][h, left]:  # eq. N29b: a capped stage over a slow link
            n_k, i_k, nxt = int(over[1][h, left]), int(over[2][h, left]), int(over[3][h, left])
        else:
            n_k = int(argN[h, left])
            i_k = int(argI[h, n_k])
            nxt = int(argH[h, left - n_k]) if argH is not None else -1
        stages.append((i_k, n_k))
        used += usage[i_k]
        left, h = left - n_k, nxt
    assert left == 0, "the DP path does not hold every layer"
    return PathResult(cost, used, tuple(stages))


def node_bound(problem: Problem, t: Tables, a: float, b: float, p_lo: int, p_hi: int,
               cutoff: float | None, mu0: np.ndarray | None = None, dp: PathDP | None = None) -> NodeBound:
    """Eq. N4: the best Lagrangian bound found in MAX_STEPS DP evaluations (stops once it reaches
    ``cutoff``); ``dp``: the node's PathDP when the caller has built it."""
    dp = dp or PathDP(problem, t, b, p_lo, p_hi)
    cap = dp.cap
    base = t.tau_weight * a  # (M - 1) a, eq. I1: (M - 1/vpp) a
    mu = np.zeros(len(cap)) if mu0 is None or len(mu0) != len(cap) else np.maximum(mu0, 0.0)
    active = np.flatnonzero(dp.usage.any(axis=0))  # rows some option draws from
    best = NodeBound(-INF, mu.copy())
    lo_mu, hi_mu = 0.0, INF  # bisection bracket (one group)
    pp = None  # eq. N16
    for step in range(1, MAX_STEPS + 1):
        res = dp.run(mu)
        if res is None:
            return NodeBound(INF, mu, None, step)
        val = base + res.cost - float(mu @ cap)
        pp = dp.per_p(val - res.cost, pp)
        if val > best.bound_s:
            best = NodeBound(val, mu.copy(), best.plan, step, res.used)
        sub = res.used - cap  # subgradient of LB at mu
        if np.all(sub <= 1e-9 * cap):
            best.plan = best.plan or _assignment(t, res)
        if cutoff is not None and best.bound_s >= cutoff:
            break
        grad = np.where((mu > 0) | (sub > 0), sub, 0.0)  # projected on mu >= 0
        if not np.any(grad):
            break  # mu is optimal: the relaxation's least path fits (complementary slackness)
        if len(active) == 1:
            g = int(active[0])
            if sub[g] > 0:
                lo_mu = mu[g]
            else:
                hi_mu = mu[g]
            if math.isinf(hi_mu):
                mu[g] = max(2 * mu[g], _mu_scale(t, cap))
            elif hi_mu - lo_mu <= MU_RTOL * hi_mu:
                break  # bracketed: the concave dual's maximum lies between, within MU_RTOL
            else:
                mu[g] = (lo_mu + hi_mu) / 2
            continue
        target = cutoff if cutoff is not None else abs(best.bound_s) * 1.05 + 1e-9
        gap = max(target - val, 1e-6 * abs(target))
        mu = np.maximum(0.0, mu + gap / float(grad @ grad) * grad)
    best.steps, best.per_p = step, pp
    if len(active) > 1 and POOLED_STEPS and best.used is not None and np.any(best.used[:dp.G] > cap[:dp.G]) \
            and (cutoff is None or best.bound_s < cutoff):
        best = _pooled_phase(dp, a, cutoff, best)
    if dp.J and NU_STEPS and math.isfinite(best.bound_s) and (cutoff is None or best.bound_s < cutoff):
        best = _inflight_phase(dp, a, b, cutoff, best)
    return best


def _pooled_phase(dp: PathDP, a: float, cutoff: float | None, best: NodeBound) -> NodeBound:
    """Several groups whose least path overfills one: the subgradient can stall where the groups are interchangeable
    (measured: two islands of one GPU type, mixtral-8x7b on 32 + 32 H100, mu = 0 after 12 steps, bound 22.595 s; one
    multiplier for every group, 0.1, gave 22.894 s). So bisection on one multiplier shared by every group's row (the
    budget row keeps its own), POOLED_STEPS DP runs; any mu >= 0 is a bound (weak duality), the best is kept."""
    cap, G = dp.cap, dp.G
    base_mu = best.mu.copy()
    lo, hi = 0.0, INF
    m = max(float(base_mu[:G].max(initial=0.0)), _mu_scale(dp.t, cap))
    pp = best.per_p
    for _ in range(POOLED_STEPS):
        mu = base_mu.copy()
        mu[:G] = m
        res = dp.run(mu)
        if res is None:
            return NodeBound(INF, mu, best.plan, best.steps)
        val = dp.tau_term(a, a, None) + res.cost - float(mu @ cap)
        pp = dp.per_p(val - res.cost, pp)
        if val > best.bound_s:
            best = NodeBound(val, mu, best.plan, best.steps, res.used, best.nu)
        best.per_p = pp
        if cutoff is not None and best.bound_s >= cutoff:
            break
        if res.used[:G].sum() > cap[:G].sum():  # the pooled row is violated: a larger price
            lo = m
            m = 2 * m if math.isinf(hi) else (lo + hi) / 2
        else:
            hi = m
            m = (lo + hi) / 2
    best.steps += POOLED_STEPS
    return best


def _inflight_phase(dp: PathDP, a: float, b: float, cutoff: float | None, best: NodeBound) -> NodeBound:
    """Eq. N7: at the best GPU multipliers, projected subgradient (Polyak) steps on the in-flight rows' multipliers
    nu_j >= 0 (row j: S_j <= j tau, eq. T2); every nu gives a bound, the best is kept."""
    mu, cap = best.mu, dp.cap
    nu = np.zeros(dp.J)
    jj = np.arange(1, dp.J + 1, dtype=float)
    for step in range(NU_STEPS):
        res = dp.run(mu, nu)
        if res is None:
            return NodeBound(INF, mu, best.plan, best.steps + step + 1, nu=nu)
        val = dp.tau_term(a, b, nu) + res.cost - float(mu @ cap)
        pp = dp.per_p(val - res.cost, best.per_p)
        if val > best.bound_s:
            best = NodeBound(val, mu, best.plan, best.steps, res.used, nu.copy())
        best.per_p = pp
        if cutoff is not None and best.bound_s >= cutoff:
            break
        coef = dp.t.tau_weight - float(jj @ nu)
        sub = dp.prefix(res.stages) - jj * (a if coef >= 0 else b)  # row j's violation by the path at tau*
        grad = np.where((nu > 0) | (sub > 0), sub, 0.0)
        if not np.any(grad > 1e-12 * max(a, 1e-12)) and not np.any(nu > 0):
            break  # no in-flight row is violated by the least path: nu = 0 is optimal here
        norm = float(grad @ grad)
        if norm <= 0:
            break
        target = cutoff if cutoff is not None else abs(best.bound_s) * 1.05 + 1e-9
        gap = max(target - val, 1e-6 * abs(target))
        nu = np.maximum(0.0, nu + gap / norm * grad)
    best.steps += step + 1
    return best


def _resources(problem: Problem, t: Tables) -> tuple[np.ndarray, np.ndarray]:
    """[n, R] what each option takes of each priced row and [R] the rows' right-hand sides: the G groups' GPUs
    (eq. G1), then the budget W1 (``Problem.budget``; weights scaled by sum(cap) / limit) when it has a limit."""
    use, cap = t.use.astype(float), np.asarray(problem.group_capacity, float)
    bud = problem.budget
    if bud is None or bud.limit <= 0:
        return use, cap
    scale = float(cap.sum()) / float(bud.limit)
    return (np.column_stack([use, np.asarray(bud.weight, float)[t.opts] * scale]), np.append(cap, cap.sum()))


def _mu_scale(t: Tables, cap: np.ndarray) -> float:
    """A first multiplier (s per GPU): one layer's time at the slowest option spread over one stage's GPUs."""
    return float(t.coef["layer_time"].max() / max(1.0, float(t.gpus.min())))


def _assignment(t: Tables, res: PathResult) -> Assignment:
    return Assignment(t.v, tuple(Stage(int(t.opts[i]), n) for i, n in res.stages))
