"""Eq. N20 (formulations/README.md): the stage DP of eq. N4 with the GPUs of every group in its state at once.

Eqs. N4-N6 keep at most one group's GPUs (or a pooled sum, eq. N6) in the state and price the others with
multipliers; on several GPU types the least path then escapes into the priced groups (measured: mixtral-8x7b x 4096
GPUs x 3 types, CLI space, an interleaved node at tau in [0.03905, 0.03924] s: the Lagrangian path takes 5888 of 1360
A100-40GB GPUs; the capacity DP with any one group exact lifts eq. N4's 0.790 s to at most 0.792 s while no plan is
below 0.861 s). Where stages are large against the groups, every group fits in the state together: per group g the
unit q_g = gcd of the GPUs its usable options take of g and R_g = floor(cap_g / q_g), so sum_j d_jg <= cap_g is
exactly sum_j d_jg / q_g <= R_g (each term an integer); the state is the vector (units used per group), flattened
mixed-radix, a stage of offset w allowed from the states whose digits stay within R. That makes the GPU rows (G1) of
every group exact, so the least path is a plan but for the in-flight rows of eq. T2 / I3, sigma's later rows and
U2; the budget row (W1), when there is one, stays priced by its multiplier.

Eq. N20b: sigma's later rows by eq. N8's cases on their bottleneck, per stage count (``sigma_dp.credits``), each case
run on this DP: on the node above, every case below the cut-off holds no path within the GPUs (0.2 s, 5 DP runs),
while eq. N8 on the Lagrangian paths gave nothing (their A100 stages, where the expert syncs are, priced away).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from functools import reduce

import numpy as np

from haap_milp.problem import Assignment, Stage
from haap_milp.solvers.common import sigma_dp
from haap_milp.solvers.common.stage_dp import INF, PathDP, inflight_cap

PATH_MAX = 4_000_000  # most floats of a run's states kept (E x (L+1) x states x slots, twice): to trace its path
LINK_TRACE_MAX = 24_000_000  # eq. N25b: most values of a crossing case's F kept over its slots (float32: 96 MB)
JOINT_MAX = 4096  # most states of the capacity vector (product of R_g + 1); more: eq. N20 does not run (but eq. N20g)
# eq. N20g: where neither every group its own digit nor the groups pooled by type fit in JOINT_MAX, every group its own
# digit up to WIDE_MAX states where a run's steps (states x endpoints x (L + 1) x footprint rows x slots) stay within
# WIDE_STEPS (0.4-1 ns a step measured on the 2-core VM: a run of at most ~0.5 s; formulations/README.md, N20g)
WIDE_MAX = 16384
WIDE_STEPS = 5e8
# eq. N20i: a run's most steps on a node the pooled state left open (measured 0.28-0.33 ns a step there with eq. N27's
# pruning: mixtral-8x7b x 64 GPUs x 3 types x 2 islands, 0.9-1.8e9 steps in 0.25-0.49 s a node)
OWN_STEPS = 2e9
# eq. N20j: a group no usable option of the node takes GPUs from gets no units in the state (False: its GPUs count)
DRAWN_ONLY = True
# eq. N20k: every group its own digit up to BIG_MAX states and BIG_STEPS steps a run, where the caller allows it
# (branch_and_bound._big_on: each island one group, its trial, then while such runs close or lift nodes)
BIG_MAX = 32768
BIG_STEPS = 2e9
SIGMA_RUNS = 40  # eq. N20b: most DP runs per node for sigma's cases (a stage count left unfinished keeps its N20 bound)
LIFT = 1e-3  # eq. N20b: a stage count's cases are run only when the lowest one lifts its bound by this much (relative)
# ``_slot``: where fewer than this share of the later part's box is finite, only its finite cells are added (the same
# floats: an INF cell changes nothing). Measured per step: dense ~1.3 ns a cell of the box, sparse ~15 ns a finite
# cell + ~4 us, so it pays below ~8 %. Measured on the same slots both ways (gbs 2048, 10 s solves): llama3-70b x 256
# GPUs x 2 types x 2 islands (boxes of ~35,000 cells, 2-10 % finite) a node worker's slots 2.22 -> 1.40 s, mixtral-8x7b
# there 0.89 -> 0.78 s, mixtral-8x7b x 4096 x 3 types (a fifth of its boxes sparse) 0.36 -> 0.36 s
SPARSE_BELOW = 0.05
# ``link_step``: where fewer than this share of F's cells is finite (``_few_finite``; and no crossing case's kinds), H is
# formed from F's finite cells alone (the same floats); eq. N27's cut (``_Cut.apply``) likewise compares those cells
# alone. Measured: on llama3-70b x 3 islands' nodes (8,925-17,493 states) 0.07 % of F is finite on average and its
# finite box is ~37 % of it, where the dense step's ~15 array passes were 40 % of a run
LINK_SPARSE_BELOW = 0.02


@dataclass
class JointUnits:
    """The capacity state of eq. N20: per digit (a group, or the pooled groups of one type) its units ``R``; per
    footprint row of the PathDP its flat offset (-1: the row takes more than a digit holds, or is not a multiple of
    the units)."""

    R: np.ndarray  # [B] units per digit (a group, or the pooled groups of one GPU type)
    size: int  # states: prod(R + 1)
    off: np.ndarray  # [rows]
    wvec: np.ndarray  # [rows, B] units per digit
    digits: np.ndarray  # [size, B] the units of each flat state
    limit: np.ndarray | None = None  # [rows, B] the digits' most units where a row's stage enters (None: R everywhere)
    blocks: list | None = None  # [B] the groups of each digit (None: a flag or counter digit, no GPUs)
    q: np.ndarray | None = None  # [B] GPUs per unit of each digit
    big: bool = False  # eq. N20k: every group its own digit past WIDE_MAX / WIDE_STEPS
    _valid: dict = field(default_factory=dict)
    _work: tuple | None = None

    def workspace(self, slots: int, E: int, L1: int) -> tuple[np.ndarray, np.ndarray]:
        """[slots, E, L+1, size] twice (H, F per slot), kept for the node's runs that trace their paths."""
        shape = (slots, E, L1, self.size)
        if self._work is None or self._work[0].shape[0] < slots or self._work[0].shape[1:] != shape[1:]:
            self._work = (np.empty(shape), np.empty(shape))
        return self._work

    def valid(self, r: int) -> np.ndarray:
        """[size] the states from which row r's stage fits (every digit plus its units within R)."""
        top = self.R if self.limit is None else self.limit[r]
        key = (int(self.off[r]), top.tobytes())
        if key not in self._valid:
            self._valid[key] = (self.digits + self.wvec[r][None, :] <= top[None, :]).all(axis=1)
        return self._valid[key]


def type_blocks(types: list[str]) -> list[list[int]]:
    """The groups of each GPU type (``types``, by group), in the order the types first appear."""
    return [[g for g in range(len(types)) if types[g] == ty] for ty in dict.fromkeys(types)]


def joint_units(dp: PathDP, types: list[str] | None = None, big: bool = False) -> JointUnits | None:
    """The state of eq. N20 for the node of ``dp``: every group its own digit, or, when that holds more than JOINT_MAX
    states, the groups of one GPU type (``types``, by group: one type on several islands) pooled into one digit against
    their summed capacity (eq. N6's relaxation: the sum of their G1 rows; the links stay exact, the endpoint is in the
    state); when that too is over JOINT_MAX, every group its own digit where the run is cheap (eq. N20g,
    ``_wide_units``), with ``big`` up to BIG_MAX states and BIG_STEPS steps (eq. N20k); else None (and with a single
    digit: eq. N5 is the same DP there)."""
    G = dp.G
    if G < 2:
        return None
    own = [[g] for g in range(G)]
    q, R = _digits(dp, own)  # (once: eq. N20g's wide state is the same digits)
    u = unit_state(dp, own, q, R)
    if u is None and types is not None and len(set(types)) < G:
        pooled = type_blocks(types)
        u = _units(dp, pooled) if len(pooled) >= 2 else None
    if u is None:
        u = _wide_units(dp, own, q, R)
    if u is None and big:
        u = _wide_units(dp, own, q, R, BIG_STEPS, BIG_MAX)
        if u is not None:
            u.big = True
    return u


def own_units(dp: PathDP) -> JointUnits | None:
    """Eq. N20i: every group its own digit (exact units) up to WIDE_MAX states and OWN_STEPS steps a run, for a node
    the pooled state (eq. N6's relaxation: a type's GPUs summed over its islands) and the crossing cases (eq. N25) leave
    open; None over them."""
    own = [[g] for g in range(dp.G)]
    return _wide_units(dp, own, *_digits(dp, own), steps=OWN_STEPS)


def run_steps(dp: PathDP, states: int) -> float:
    """Eq. N20g: the steps of one run of eq. N20 on ``states`` capacity states (each slot adds every footprint row's
    stage to every (endpoint, layers held, state) cell)."""
    return float(states) * dp.E * (dp.L + 1) * len(dp.row_usage) * max(dp.k_max, 1)


def _units(dp: PathDP, blocks: list[list[int]]) -> JointUnits | None:
    return unit_state(dp, blocks, *_digits(dp, blocks))


def _wide_units(dp: PathDP, blocks: list[list[int]], q: np.ndarray, R: np.ndarray,
                steps: float | None = None, most: int | None = None) -> JointUnits | None:
    """Eq. N20g: every group its own digit (``blocks``, units ``q``, most units ``R``) past JOINT_MAX, up to ``most``
    (default WIDE_MAX) states and ``steps`` (default WIDE_STEPS) steps a run."""
    most = WIDE_MAX if most is None else most
    states = float(np.prod(R + 1.0))
    if states > most or run_steps(dp, int(states)) > (WIDE_STEPS if steps is None else steps):
        return None
    return unit_state(dp, blocks, q, R, share=most / JOINT_MAX)


def unit_sizes(dp: PathDP, blocks: list[list[int]]) -> np.ndarray:
    """[B] per digit (a block of groups) its unit: the gcd of the GPUs the node's usable options take of the block."""
    use = np.column_stack([dp.usage[:, b].sum(axis=1) for b in blocks]).astype(np.int64)  # [n, B] per option
    usable = _usable(dp)
    return np.array([reduce(math.gcd, use[usable, j].tolist(), 0) or 1 for j in range(len(blocks))], np.int64)


def drawn_groups(dp: PathDP) -> np.ndarray:
    """[G] whether some usable option of the node takes GPUs of each group. Eq. N20j: a group none takes from holds no
    stage of the node's plans, so its GPUs count for nothing in the state (a digit of such groups alone has R = 0): e.g.
    the groups of an island a node is kept out of (eq. N9b), which as 688 units of 1 GPU made the state too large for
    eq. N20 to run at all. (DRAWN_ONLY False: every group counts, as before.)"""
    if not DRAWN_ONLY:
        return np.ones(dp.G, bool)
    return (dp.usage[_usable(dp), :dp.G] > 0).any(axis=0)


def _usable(dp: PathDP) -> np.ndarray:
    """[n] the node's options that may be in a plan: kept, and holding a layer at some slot."""
    t = dp.t
    return dp.keep & ((t.U >= 1).any(axis=0) | (t.Uf >= 1).any(axis=0))


def _digits(dp: PathDP, blocks: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per digit (a block of groups) its unit q (GPUs) and its most units R = floor(the GPUs of the block's groups that
    some usable option takes from / q): R = 0 for a block none takes from (eq. N20j, ``drawn_groups``)."""
    q = unit_sizes(dp, blocks)
    mine = drawn_groups(dp)
    cap = np.array([float(sum(dp.cap[g] for g in b if mine[g])) for b in blocks])
    return q, (cap // q).astype(np.int64)


def unit_state(dp: PathDP, blocks: list[list[int]], q: np.ndarray, R: np.ndarray, share: float = 1.0,
               limit: np.ndarray | None = None) -> JointUnits | None:
    """The flattened state of digits ``R`` (units ``q``, one per block of groups); a row enters where it is a whole
    number of units within R (within its own ``limit`` [rows, B] when given). None over ``share`` x JOINT_MAX states."""
    if float(np.prod(R + 1.0)) > share * JOINT_MAX:
        return None
    stride = np.cumprod(np.r_[1, (R + 1)[:-1]]).astype(np.int64)
    rows = np.column_stack([dp.row_usage[:, b].sum(axis=1) for b in blocks]).astype(np.int64)
    wvec = rows // q[None, :]
    exact = (rows % q[None, :] == 0).all(axis=1) & (wvec <= (R[None, :] if limit is None else limit)).all(axis=1)
    off = np.where(exact, (wvec * stride[None, :]).sum(axis=1), -1)
    size = int(np.prod(R + 1))
    digits = (np.arange(size)[:, None] // stride[None, :]) % (R + 1)[None, :]
    return JointUnits(R, size, off, wvec, digits, limit, list(blocks), np.asarray(q, np.int64))


def least_paths(dp: PathDP, a: float, mu: np.ndarray, u: JointUnits, tables=None,
                plans: list | None = None, links=None, prune: float | None = None) -> dict[int, float]:
    """Eq. N20: per stage count P of the node, a lower bound on T of its plans of P stages (inf: none) -- the tau
    term at ``a``, plus the least path within every group's GPUs (times, links and the first stage's sync, eq. N4's
    costs), the budget row priced by ``mu`` (``mu`` on the groups is not used: their rows are exact). ``tables``:
    (first, nonfirst, k_max) in place of the node's (eq. N20b's thresholds). ``plans``: the least path over every P
    is appended as an Assignment (it fits every group's GPUs; the caller checks the rows the DP leaves out), where
    the slots' states fit PATH_MAX floats. ``links``: the step over a link and the (units, states) a first stage may
    close from in place of ``link_step`` and every state (eq. N25's crossing cases, ``island_crossings``); with
    ``plans``, a case whose ``links.traced`` has its least path traced too (eq. N25b, ``_backtrack_links``).
    ``prune`` (eq. N27): a partial path that cannot finish below it is dropped, and a P whose least lies at or above it
    gets ``prune`` (a bound on its plans, exact below it; paths below it are traced as before). A case whose
    ``links.dtype`` is float32 runs in float32, each value taken down by its rounding's bound (eq. N27b)."""
    t, L, E, N = dp.t, dp.L, dp.E, u.size
    first_t, nonfirst_t, k_max = tables if tables is not None else (dp.first, dp.nonfirst, dp.k_max)
    mu_o = np.maximum(np.asarray(mu, float), 0.0)
    mu_o[:dp.G] = 0.0
    mu_cost = dp.row_usage @ mu_o  # [rows] (the budget row only)
    base = t.tau_weight * a - float(mu_o @ dp.cap)
    # eq. N10: with nothing priced a slot's cost is its time and links, so the in-flight row k < M cuts states
    pure = t.vpp <= 1 and not dp.extra_priced and not np.any(mu_cost > 0)
    fits = E * (L + 1) * N * k_max <= PATH_MAX
    keep = plans is not None and fits and links is None
    # eq. N25b: a crossing case's path, traced from each slot's F alone (its H is recomputed for one endpoint)
    keep_f = plans is not None and links is not None and links.traced and link_trace_fits(dp, N, k_max)
    held: list = []  # [slot k - 1]: (F, cost) of slot k (eq. N25b)
    out: dict[int, float] = {}
    trace, best = [], (INF, None)  # per slot k (H in, F out, cost), and (value, (P, row, n)) of the least pipeline
    F = None  # [E, L+1, N]: slots 1..k-1, slot k-1 at endpoint e, l layers, the units used
    # (reused across the node's runs: fresh pages cost more); eq. N25's cases keep two slots' buffers of their own
    work = u.workspace(k_max, E, L + 1) if fits and links is None else None
    # a case may run in float32 (eq. N27b): every value then loses (2 k_max + 4) units of 2^-24 of itself (each of at
    # most 2 k_max terms rounded once and added once, all terms >= 0), and every cut keeps that much above it
    dtype = np.float64 if links is None else links.dtype
    f32 = dtype == np.float32
    tol = (2 * k_max + 4) * 2.0 ** -24 if f32 else 1e-9
    cut = None if prune is None else _Cut(dp, u, mu, mu_cost, links, (first_t, nonfirst_t, k_max), prune, base, tol,
                                          dtype)
    fin = None  # F's finite cells after eq. N27's cut (its mask, read again by the stop test and the next link step)
    for k in range(1, k_max + 1):
        if links is not None:
            H = None if F is None else links.step(F, dp.link, links.buffer(0, (E, L + 1, N)))
        else:
            H = None if F is None else link_step(F, dp.link, None if work is None else work[0][k - 1], fin=fin)
        if keep:
            trace.append([H, None, None])
        if k in first_t and (links is None or k > links.least):  # (P stages have P - 1 links)
            uc, Hc = (u, H) if links is None else links.closing(u, H)
            val, arg = _close(dp, uc, first_t[k][0] + mu_cost[:, None], Hc)
            out[k] = base + val - (tol * val if f32 and val < INF else 0.0)  # (float32: its rounding taken off)
            if val < best[0]:
                best = (val, (k, *arg))
        if k >= k_max:
            break
        cost = (nonfirst_t[k][0] + mu_cost[:, None]).astype(dtype, copy=False)
        F = _slot(dp, u, cost, H, links.buffer(1, (E, L + 1, N)) if links is not None else
                  None if work is None else work[1][k - 1])
        if pure and k < t.M:
            F[F > inflight_cap(k, dp.b) * (1 + tol if f32 else 1)] = INF
        fin = None if cut is None else cut.apply(F, k)
        if keep:
            trace[-1][1:] = F, cost
        if keep_f:  # (float32: the trace takes argmins, and every finite entry is a partial path that exists)
            held.append((F.astype(np.float32), cost))
        if not (np.isfinite(F) if fin is None else fin).any():
            break
    if keep and best[1] is not None:
        plans.append(_backtrack(dp, u, trace, first_t, nonfirst_t, *best[1]))
    if keep_f and best[1] is not None:
        plan = _backtrack_links(dp, u, links, held, first_t, nonfirst_t, *best[1])
        if plan is not None:
            plans.append(plan)
    if prune is not None:  # (a P left without a path may have had one at or above ``prune``)
        out = {P: min(out.get(P, INF), prune) for P in first_t if P <= k_max and (links is None or P > links.least)}
    return out


class _Cut:
    """Eq. N27's cut of one run: a partial path at slot k, state s, l layers held, whose value F exceeds ``prune - base``
    less its completion bound ``ahead[k][L - l] - slack[s]`` (``completion`` priced by ``_completion_prices``, less the
    free GPUs' credit, plus the case's debt) is dropped. The margin is ``tol`` of the largest value a kept entry may
    hold (|prune| - base where the base is negative: a priced budget row)."""

    def __init__(self, dp: PathDP, u: JointUnits, mu: np.ndarray, mu_cost: np.ndarray, links, tables: tuple,
                 prune: float, base: float, tol: float, dtype):
        first_t, nonfirst_t, k_max = tables
        gpu_mu, self.slack = _completion_prices(dp, u, mu)
        if links is not None:
            self.slack = self.slack - links.owed(dp, u.size)
        self.ahead = completion(dp, first_t, nonfirst_t, mu_cost + dp.row_usage @ gpu_mu, k_max)
        self.room, self.margin, self.dtype = prune - base, tol * (abs(prune) + max(0.0, -base)), dtype

    def apply(self, F: np.ndarray, k: int) -> np.ndarray:
        """F [E, L+1, states] of slot k: the entries that cannot finish below the prune value set to INF, in place
        (where under LINK_SPARSE_BELOW of F is finite, its finite cells alone: each cell's limit is the same floats).
        Returns F's finite mask after the cut (F's shape)."""
        rest = self.room - self.ahead[k][::-1] + self.margin  # [L+1]
        fin = np.isfinite(F)
        if F.flags.c_contiguous and _few_finite(fin):
            flat, mask = F.reshape(-1), fin.reshape(-1)
            cells = np.flatnonzero(mask)
            li, si = np.divmod(cells % (F.shape[1] * F.shape[2]), F.shape[2])
            top = (rest[li] + self.slack[si]).astype(self.dtype)
            drop = cells[flat[cells] > top]
            flat[drop] = INF
            mask[drop] = False
            return fin
        drop = F > (rest[:, None] + self.slack[None, :]).astype(self.dtype)
        F[drop] = INF
        return fin & ~drop


def _completion_prices(dp: PathDP, u: JointUnits, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. N27's prices: ([G] per GPU of each group, [states] the priced GPUs still free in each state). A digit's
    groups share the least of their multipliers (its state counts their sum); groups in no digit are not priced."""
    gpu = np.zeros(len(dp.cap))  # (the budget row's column, if any, stays 0: mu_cost prices it)
    free = np.zeros(u.size)
    if u.blocks is None:
        return gpu, free
    mu = np.maximum(np.asarray(mu, float)[:dp.G], 0.0)
    for j, b in enumerate(u.blocks):
        price = float(mu[b].min()) if len(b) else 0.0
        gpu[b] = price
        free += price * (float(dp.cap[b].sum()) - u.q[j] * u.digits[:, j])
    return gpu, free


def completion(dp: PathDP, first_t: dict, nonfirst_t: dict, mu_cost: np.ndarray, k_max: int) -> np.ndarray:
    """Eq. N27: [k_max + 1, L + 1] A[k, m], a lower bound on what a path that holds slots 1..k still pays for its
    earlier stages (slots k + 1 up to its first, m layers in all), the link into slot k included: eq. N4's costs,
    each slot's least row per layer count (no GPUs, any endpoint), every link the least one. INF: no way to finish."""
    L = dp.L
    finite = dp.link[np.isfinite(dp.link)]
    hop = float(finite.min()) if finite.size else INF
    m = np.arange(L + 1)
    back = m[:, None] - m[None, :]  # [m, n]: layers left for the slots after a stage of n
    A = np.full((k_max + 1, L + 1), INF)
    for k in range(k_max - 1, 0, -1):
        j, best = k + 1, np.full(L + 1, INF)
        if j in first_t:  # slot j is the first stage: it holds all m
            best = np.minimum(best, (first_t[j][0] + mu_cost[:, None]).min(axis=0))
        if j in nonfirst_t and j < k_max:  # a stage of n at slot j, the rest earlier still
            nf = (nonfirst_t[j][0] + mu_cost[:, None]).min(axis=0)
            best = np.minimum(best, np.where(back >= 0, nf[None, :] + A[j][np.clip(back, 0, L)], INF).min(axis=1))
        A[k] = best + hop
    return A


def link_trace_fits(dp: PathDP, states: int, k_max: int) -> bool:
    """Eq. N25b: whether a crossing case's F over its slots (``states`` each) fits LINK_TRACE_MAX values."""
    return dp.E * (dp.L + 1) * states * k_max <= LINK_TRACE_MAX


def _backtrack_links(dp: PathDP, u: JointUnits, links, held: list, first_t: dict, nonfirst_t: dict, P: int, r: int,
                     n: int) -> Assignment | None:
    """Eq. N25b: a crossing case's least pipeline as a plan, from its first stage (slot P, row r, n layers) down to
    slot 1: at each step the endpoint, state, row and layers of least value (argmins over the kept F, not equalities:
    the H they were formed from is recomputed). None where the trace finds no finite step."""
    t, L = dp.t, dp.L
    stages = [(int(first_t[P][1][r, n]), n)]
    left, g = L - n, int(dp.row_group[r])
    if P > 1:
        H = links.later_at(held[P - 2][0], dp.link, g)
        s = int(np.argmin(np.where(u.valid(r), H[left], INF)))
    for k in range(P - 1, 0, -1):
        F, cost = held[k - 1]
        step = links.origin(dp, F, g, left, s)  # (endpoint h of slot k, its state) that reached H[left, s]
        if step is None:
            return None
        h, s = step
        Hk = links.later_at(held[k - 2][0], dp.link, h) if k > 1 else None
        found = _least_stage(u, Hk, cost, h, left, s, dp.row_group)
        if found is None:
            return None
        r2, n2, s = found
        stages.append((int(nonfirst_t[k][1][r2, n2]), n2))
        left, g = left - n2, h
    return Assignment(t.v, tuple(Stage(int(t.opts[i]), m) for i, m in stages))


def _least_stage(u: JointUnits, H, cost: np.ndarray, h: int, left: int, s: int, row_group: np.ndarray):
    """(row, n, state before) of the least stage at endpoint h holding n of ``left`` layers that ends in state s, on the
    later part H (None: slot 1, the stage alone from state 0); None if there is none."""
    best, arg = INF, None
    n = np.arange(left + 1)
    for r in np.flatnonzero((row_group == h) & (u.off >= 0) & (u.off <= s)).tolist():
        prev = s - int(u.off[r])
        if H is None:
            if prev == 0 and cost[r, left] < best:
                best, arg = float(cost[r, left]), (r, left, 0)
        elif u.valid(r)[prev]:
            tot = H[left - n, prev] + cost[r, :left + 1]
            i = int(np.argmin(tot))
            if tot[i] < best:
                best, arg = float(tot[i]), (r, i, prev)
    return arg if math.isfinite(best) else None


def tau_cap(dp: PathDP, a: float, bound: float, cutoff: float) -> float:
    """Eq. N26: the largest tau a plan of the node below ``cutoff`` may have, from a bound of eqs. N20/N20b/N25 at the
    node's lower end ``a``: each is tau_weight * a plus a least path whose cost does not depend on tau (the layer bounds
    are those of the node's upper end b, the in-flight cut is at b), so a plan of period tau pays at least
    ``bound + tau_weight (tau - a)``. -inf: no plan (an infinite bound)."""
    if not math.isfinite(bound):
        return -INF if bound > 0 else INF
    w = dp.t.tau_weight
    return a + (cutoff - bound) / w * (1 + 1e-9) + 1e-12 * abs(a) if w > 0 else INF


def _backtrack(dp: PathDP, u: JointUnits, trace: list, first_t: dict, nonfirst_t: dict, P: int, r: int,
               n: int) -> Assignment:
    """The least pipeline as a plan: from its first stage (slot P, row r, n layers) down to slot 1, each slot's
    endpoint, row and layers found by the equalities the DP's minima were taken by (the same float sums);
    ``trace[k - 1]``: slot k's (later part H, F, cost)."""
    t, L = dp.t, dp.L
    stages = [(int(first_t[P][1][r, n]), n)]
    left, g = L - n, int(dp.row_group[r])
    H = trace[P - 1][0]
    s = int(np.argmin(np.where(u.valid(r), H[g][left], INF))) if P > 1 else 0
    for k in range(P - 1, 0, -1):
        Hn, F, cost = trace[k - 1]
        h = next(h for h in range(dp.E) if F[h, left, s] + dp.link[g, h] == H[g, left, s])
        r2, n2 = _stage_at(u, Hn, cost, h, left, s, F[h, left, s], dp.row_group)
        stages.append((int(nonfirst_t[k][1][r2, n2]), n2))
        left, s, g, H = left - n2, s - int(u.off[r2]), h, Hn
    return Assignment(t.v, tuple(Stage(int(t.opts[i]), m) for i, m in stages))


def _stage_at(u: JointUnits, H, cost: np.ndarray, h: int, left: int, s: int, value: float, row_group: np.ndarray):
    """(row, n) of a stage at endpoint h that ``_slot`` reached F[h, left, s] = ``value`` by: n layers on the later part
    H[h][left - n, s - off] from a state where the row fits (at slot 1, H None: the stage alone, state off)."""
    n = np.arange(left + 1)
    for r in np.flatnonzero((row_group == h) & (u.off >= 0) & (u.off <= s)).tolist():
        prev = s - int(u.off[r])
        if H is None:
            if prev == 0 and cost[r, left] == value:
                return r, left
        elif u.valid(r)[prev]:
            hit = np.flatnonzero(H[h][left - n, prev] + cost[r, :left + 1] == value)
            if len(hit):
                return r, int(hit[0])
    raise AssertionError("the joint DP's path does not trace back")  # (the sums are the DP's own: unreachable)


def link_step(F: np.ndarray, link: np.ndarray, out: np.ndarray | None = None, kind: np.ndarray | None = None,
              moved=None, fin: np.ndarray | None = None) -> np.ndarray:
    """H[e] = min_h S_k[h] + link[e, h] for each row e of ``link`` (every endpoint, or a few), k = ``kind[e, h]``
    (default 0): S_0 = F, S_1[h] = ``moved(h, F[h])`` (eq. N25: F[h] across a crossing between islands). Links take few distinct prices (a block of endpoints behind one NIC), so
    per e the h are grouped by (k, price) and each group's least source, min_h S_k[h], is formed once and shared by
    every e with the same group (E x E x L x N would not fit, and one pair at a time cost 144 array passes on 12
    endpoints). The sums are the same floats as F[h] + link[e, h] at the least h (eq. N20's traceback reads them).
    Where few of F's cells are finite (LINK_SPARSE_BELOW), ``_link_cells`` instead. ``fin``: F's finite mask, when
    the caller has it."""
    fin = np.isfinite(F) if fin is None else fin
    if kind is None and (out is None or out.flags.c_contiguous) and _few_finite(fin):
        return _link_cells(F, fin, link, out)
    live = [h for h in range(F.shape[0]) if fin[h].any()]
    H = np.empty((link.shape[0], *F.shape[1:])) if out is None else out
    src: dict = {}  # (k, h) -> S_k[h]
    least: dict = {}  # (k, hs) -> min over hs of S_k[h]
    tmp = np.empty(F.shape[1:], F.dtype)
    for e in range(link.shape[0]):
        groups: dict = {}
        for h in live:
            c = float(link[e, h])
            if math.isfinite(c):
                groups.setdefault((0 if kind is None else int(kind[e, h]), c), []).append(h)
        if not groups:
            H[e] = INF
        for j, ((k, c), hs) in enumerate(groups.items()):
            key = (k, tuple(hs))
            if key not in least:
                for h in hs:
                    if (k, h) not in src:
                        src[k, h] = F[h] if k == 0 else moved(h, F[h])
                m = src[k, hs[0]].copy() if len(hs) > 1 else src[k, hs[0]]
                for h in hs[1:]:
                    np.minimum(m, src[k, h], out=m)
                least[key] = m
            if j == 0:
                np.add(least[key], c, out=H[e])
            else:
                np.add(least[key], c, out=tmp)
                np.minimum(H[e], tmp, out=H[e])
    return H


def _few_finite(fin: np.ndarray) -> bool:
    """Whether under LINK_SPARSE_BELOW of a table's cells are finite (``fin``: its finite mask): its link step and
    eq. N27's cut then read the finite cells alone."""
    return np.count_nonzero(fin) < LINK_SPARSE_BELOW * fin.size


def _link_cells(F: np.ndarray, fin: np.ndarray, link: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``link_step`` (no kinds) from F's finite cells (``fin``) alone: H INF, then per source h and row e the cells of h
    take their min with F[h] + link[e, h]. The same floats as the dense step: min over h of fl(F[h] + c) equals
    fl(min over h of F[h] + c) for a common c (rounding is monotone), and each cell's min is over the same sums."""
    H = np.empty((link.shape[0], *F.shape[1:])) if out is None else out
    H[...] = INF
    flat, src = H.reshape(H.shape[0], -1), F.reshape(F.shape[0], -1)  # (views: H is contiguous)
    for h in range(F.shape[0]):
        cells = np.flatnonzero(fin[h])
        if not len(cells):
            continue
        vals = src[h, cells]
        for e in range(link.shape[0]):
            c = float(link[e, h])
            if math.isfinite(c):
                flat[e, cells] = np.minimum(flat[e, cells], vals + c)
    return H


def _slot(dp: PathDP, u: JointUnits, cost: np.ndarray, H, out: np.ndarray | None = None) -> np.ndarray:
    """F at a non-first slot: per row (footprint) and layer count n its stage on top of the later part H (into
    ``out`` when given)."""
    L, E, N = dp.L, dp.E, u.size
    F = np.full((E, L + 1, N), INF) if out is None else out
    F[...] = INF
    held: dict = {}  # endpoint g -> (H[g]'s finite box, its finite cells where sparse, else None)
    for r in np.flatnonzero(u.off >= 0):
        ns = np.flatnonzero(np.isfinite(cost[r]))
        if not len(ns):
            continue
        g, off = int(dp.row_group[r]), int(u.off[r])
        if H is None:  # slot 1: the stage alone
            F[g, ns, off] = np.minimum(F[g, ns, off], cost[r, ns])
            continue
        if g not in held:
            held[g] = _later_box(H[g])
        (lo, hi, c0, c1), cells = held[g]
        c1 = min(c1, N - off)
        if lo >= hi or c0 >= c1:
            continue
        if cells is not None:
            _add_cells(F[g], cells, u.valid(r), off, cost[r], ns, L, N)
            continue
        src = np.where(u.valid(r)[None, c0:c1], H[g][lo:hi, c0:c1], INF)  # l = lo..hi-1, states c0..c1-1
        dst = F[g, :, off + c0:off + c1]
        for n in ns.tolist():  # n layers here on l layers later, l + n <= L (one [<= hi-lo, c1-c0] min at a time)
            top = min(hi, L + 1 - n)
            if top > lo:  # (H is INF outside its box: those entries change nothing)
                np.minimum(dst[lo + n:top + n], src[:top - lo] + cost[r, n], out=dst[lo + n:top + n])
    return F


def _later_box(Hg: np.ndarray) -> tuple[tuple[int, int, int, int], tuple | None]:
    """The later part's finite box (rows [lo, hi), states [c0, c1); else INF) and, where under SPARSE_BELOW of it is
    finite, its finite cells (layers ascending, states, values), else None."""
    fin = np.isfinite(Hg)
    rows, cols = np.flatnonzero(fin.any(axis=1)), np.flatnonzero(fin.any(axis=0))
    if not len(rows):
        return (0, 0, 0, 0), None
    lo, hi, c0, c1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
    if np.count_nonzero(fin) >= SPARSE_BELOW * (hi - lo) * (c1 - c0):
        return (lo, hi, c0, c1), None
    cells = np.flatnonzero(fin)  # (row-major: the layer counts ascending)
    return (lo, hi, c0, c1), (cells // Hg.shape[1], cells % Hg.shape[1], Hg.ravel()[cells])


def _add_cells(Fg: np.ndarray, cells: tuple, valid: np.ndarray, off: int, cost_r: np.ndarray, ns: np.ndarray, L: int,
               N: int) -> None:
    """``_slot``'s step for one row on a sparse later part: each finite cell (l, s) where the row fits (``valid``,
    s + off < N) gives Fg[l + n, s + off] its min with H + cost for every n with l + n <= L; the same floats as the
    dense step (the cells of one n land on distinct targets, so one fancy-indexed min per n is exact)."""
    li, si, vals = cells
    keep = valid[si] & (si < N - off)
    li, si, vals = li[keep], si[keep] + off, vals[keep]
    for n in ns.tolist():
        k = int(np.searchsorted(li, L - n, side="right"))  # (cells with l + n <= L)
        if k:
            ln, sn = li[:k] + n, si[:k]
            Fg[ln, sn] = np.minimum(Fg[ln, sn], vals[:k] + cost_r[n])


def _close(dp: PathDP, u: JointUnits, cost: np.ndarray, H) -> tuple[float, tuple[int, int]]:
    """The least pipeline with its first stage at this slot: a row's stage of n layers on the later part holding
    L - n from a state where it fits; (value, (row, n))."""
    L = dp.L
    best, arg = INF, (0, 0)
    for r in np.flatnonzero(u.off >= 0).tolist():
        if not np.isfinite(cost[r]).any():
            continue
        if H is None:  # P = 1: the stage holds every layer
            tot = np.full(L + 1, INF)
            tot[L] = cost[r, L]
        else:
            later = np.where(u.valid(r)[None, :], H[int(dp.row_group[r])], INF).min(axis=1)  # [L+1]
            tot = cost[r] + later[::-1]  # later[L - n] for n = 0..L
        n = int(np.argmin(tot))
        if tot[n] < best:
            best, arg = float(tot[n]), (r, n)
    return best, arg


def joint_bound(dp: PathDP, a: float, mu: np.ndarray, cutoff: float | None, beta: float, u: JointUnits,
                deadline: float = math.inf, plans: list | None = None,
                incumbent: float | None = None, cases: bool = True,
                info: dict | None = None) -> tuple[float, np.ndarray]:
    """Eqs. N20, N20b on the node: (bound, [k_max + 1] per stage count P its bound, inf outside the node's range).
    Sigma's cases run per stage count whose N20 bound is below ``cutoff``, the least first, until one is not lifted (the
    node's bound, their least, cannot rise past it), SIGMA_RUNS DP runs in all; each case (e0, e1] bounds the plans
    whose sigma bottleneck lies in it by e0 + (least path of P stages whose every sigma_k <= e1, first stage's time
    alone); a count whose cases all finish is bounded by their least (those from cutoff - (its path without
    thresholds) up are at the cutoff, eq. N8), else by its N20 bound. A count whose least path plus the largest sync
    of any stage stays below ``cutoff`` is not run (no case can reach it). The lowest case at the finest split runs first:
    when it lifts a count's bound by less than LIFT, the count's cases are not run (measured: mixtral-8x7b x 64 GPUs x
    3 types x 2 islands, where sigma does not bind, 40 runs cost 0.9-1.1 s a node for nothing). ``plans``: each run's
    least path is appended (``least_paths``). ``incumbent``: eq. N27 drops the partial paths that cannot finish below
    it, in every run (a path of DP value v is a plan of T >= v, a case's too: none above it is wanted). ``cases``
    False: eq. N20 alone (eq. N20h's gate). ``info``: filled with the bound before the cases (``plain``), their DP
    runs (``case_runs``) and their time (``case_s``, s)."""
    per = least_paths(dp, a, mu, u, plans=plans, prune=incumbent)
    out = np.full(dp.k_max + 1, INF)
    for P, val in per.items():
        out[P] = val
    if info is not None:
        info.update(plain=float(out.min()), case_runs=0, case_s=0.0)
    if cutoff is None or not cases:
        return float(out.min()), out
    t0 = time.perf_counter()
    runs = _cases(dp, a, mu, cutoff, beta, u, per, out, deadline, plans, incumbent)
    if info is not None:
        info.update(case_runs=runs, case_s=time.perf_counter() - t0)
    return float(out.min()), out


def _cases(dp: PathDP, a: float, mu: np.ndarray, cutoff: float, beta: float, u: JointUnits, per: dict,
           out: np.ndarray, deadline: float, plans: list | None, incumbent: float | None) -> int:
    """Eq. N20b's sigma cases (``joint_bound``'s rules), lifting ``out`` [k_max + 1] in place; returns the DP runs."""
    nonfirst, sync, tmax = sigma_dp.later_rows(dp)
    # the most sigma can be (no credit): a path of time-and-links cost c pays at most c + sig_hi, so a count whose least
    # such path is below cutoff - sig_hi cannot be pruned by the cases (its N20 bound, with s_0 >= 0, bounds that cost)
    sig_hi = max([float(np.max(x[np.isfinite(x)], initial=0.0)) for x in sync.values()]
                 + [float(np.max(sy[np.isfinite(tm)], initial=0.0)) for tm, sy in dp._first_parts.values()])
    runs = 0
    for P in sorted(per, key=per.get):  # the least first: the node's bound rises only while each of them does
        if per[P] >= cutoff or per[P] + sig_hi < cutoff:
            break
        if runs >= SIGMA_RUNS or time.perf_counter() > deadline:
            break
        tm, sy = dp._first_parts[P]
        credit, lo = sigma_dp.credits(tm, sy, tmax, P, beta)

        def least(x, P=P, tm=tm, sy=sy, credit=credit):  # P stages, every sigma_k <= x, first stage's time only
            tables = ({P: dp._rows(np.where(sy <= x, tm, INF))},
                      {k: dp._rows(np.where(sync[k] - credit[k] <= x, nonfirst[k], INF)) for k in credit}, P)
            return least_paths(dp, a, mu, u, tables, plans, prune=incumbent).get(P, INF)

        free = least(INF)
        runs += 1
        if free + sig_hi < cutoff:
            break
        top = cutoff - free + 1e-7 * abs(cutoff)  # a case from here up lies at or above the cutoff
        width = (top - lo) / sigma_dp.SIGMA_BUCKETS
        # the lowest case at the finest split first: when even it lifts nothing, neither do the cases together
        low = lo + least(lo + width / 2 ** sigma_dp.SIGMA_SPLITS) if lo < top else INF
        runs += 1
        if low <= per[P] * (1 + LIFT):
            break
        cases = [free + max(lo, top)]
        todo = [(e0, e1, 0) for e0, e1 in itertools.pairwise(np.linspace(lo, top, sigma_dp.SIGMA_BUCKETS + 1))] \
            if lo < top else []
        while todo and runs < SIGMA_RUNS and time.perf_counter() <= deadline:
            e0, e1, depth = todo.pop()
            val = e0 + least(e1)
            runs += 1
            if val < cutoff and depth < sigma_dp.SIGMA_SPLITS:
                mid = (e0 + e1) / 2
                todo += [(e0, mid, depth + 1), (mid, e1, depth + 1)]
            else:
                cases.append(val)
        if todo:
            break
        out[P] = max(out[P], min(cases))
    return runs
