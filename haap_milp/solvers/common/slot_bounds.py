"""Per-variant slot tables: how many layers each option can hold at each stage slot.

Slots are indexed from the END of the pipeline, k = 1 .. K (k = 1 is the last stage), so a
stage at slot k holds a_k = min(k, M) micro-batches of activations (eq. M1) and its memory
is linear in its layer count (eq. M2). Equation labels: formulations/README.md.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import numpy as np

from haap_milp import worker
from haap_milp.pipeline import (
    END_SEND_SHARE,
    MEM_RTOL,
    SEND_SHARE,
    TIME_RTOL,
    inflight,
    inflight_1f1b,
    interleaved_tau_weight,
    memory_limit,
    stage_memory,
)

__all__ = ["MEM_RTOL", "Tables", "build_tables", "max_layers_mem", "usable_options"]  # MEM_RTOL: re-exported
from haap_milp.problem import Problem

COEF_KEYS = ("layer_time", "first_time", "last_time", "sync_fixed", "sync_per_layer", "sync_first", "sync_last")


@dataclass
class Tables:
    """Everything a solver needs about one variant, restricted to the usable options.

    Local option index i refers to global option ``opts[i]``. Arrays ``U``, ``Uf``, ``lo``,
    ``lof`` have shape [K, n] with row k-1 for slot k."""

    v: int
    M: int
    L: int
    K: int
    opts: np.ndarray  # global option indices (usable: allowed and fitting their group)
    group: np.ndarray  # p2p endpoint (its GPU group; a mixed option's own row of p2p, eq. H5)
    gpus: np.ndarray  # GPUs in all
    use: np.ndarray  # [n, G] GPUs of each group (eq. G1; one non-zero unless mixed, eq. H1)
    tp: np.ndarray
    sig: np.ndarray  # signature id (eq. U1)
    coef: dict  # COEF_KEYS -> float arrays [n]
    p2p: np.ndarray  # [E, E] between endpoints
    U_mem: np.ndarray  # max layers as a non-first stage, memory only (eq. M2, U[k,o])
    Uf_mem: np.ndarray  # as the first stage
    U: np.ndarray  # effective upper bound (memory and the time cut-off, eq. X1)
    Uf: np.ndarray
    lo: np.ndarray  # time-dominance lower bound when used non-first (eq. D1); > U means unusable
    lof: np.ndarray
    p_min: int  # fewer stages cannot hold L layers (eq. P1)
    p_max: int  # more stages cannot be used
    tau_ub: float | None  # the time cut-off used (None: none)
    dom: np.ndarray | None = None  # [n, n] dom[a, b]: a time-dominates b (eq. D1, ``time_dominance``)
    vpp: int = 1  # interleaved 1F1B chunks (eqs. I1-I5); > 1: the stage count is fixed to num_stages
    num_stages: int = 0

    @property
    def tau_weight(self):
        """tau's coefficient in the objective: M - 1 (eq. T1), M - 1/vpp (eq. I1)."""
        return interleaved_tau_weight(self.M, self.vpp)

    @property
    def n(self) -> int:
        return len(self.opts)

    def nonfirst_ok(self, k: int) -> np.ndarray:
        """Options that may run slot k as a non-first stage (then slot k+1 exists)."""
        if k >= self.p_max:
            return np.zeros(self.n, bool)
        return (self.lo[k - 1] <= self.U[k - 1]) & (self.U[k - 1] >= 1)

    def holding(self) -> np.ndarray:
        """[n] options that may hold a layer at some slot, first or not (their U or Uf reaches 1 somewhere)."""
        return (self.U >= 1).any(axis=0) | (self.Uf >= 1).any(axis=0)

    def first_ok(self, k: int) -> np.ndarray:
        if k < self.p_min or k > self.p_max:
            return np.zeros(self.n, bool)
        return (self.lof[k - 1] <= self.Uf[k - 1]) & (self.Uf[k - 1] >= 1)


def _mem(var, o, n, a, first: bool, last: bool):
    """problem.stage_memory vectorised over options: the same ``pipeline.stage_memory`` (eq. M2)."""
    f = (var.first_static_mem[o], var.first_act_mem[o]) if first else None
    x = (var.last_static_mem[o], var.last_act_mem[o]) if last else None
    return stage_memory(var.fixed_mem[o], var.layer_static_mem[o], var.layer_act_mem[o], n, a, f, x)


def max_layers_mem(problem: Problem, v: int, o: np.ndarray, k: int, first: bool) -> np.ndarray:
    """Largest n with stage memory <= capacity at slot k (eq. M2); 0 when none fits, at most L."""
    var = problem.variants[v]
    a = inflight_1f1b(k, var.num_microbatches) if var.vpp <= 1 else \
        inflight("interleaved", var.num_stages - k, var.num_stages, var.num_microbatches, var.vpp)  # eq. M1 / I4
    cap = memory_limit(var.mem_capacity[o])  # the fit test of problem.violations (pipeline.fits_memory)
    base = _mem(var, o, 0.0, a, first, k == 1)
    per = var.layer_static_mem[o] + a * var.layer_act_mem[o]
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = np.where(per > 0, np.floor((cap - base) / np.where(per > 0, per, 1.0)), problem.num_layers)
    n = np.clip(guess, 0, problem.num_layers)
    for _ in range(3):  # repair float rounding against the exact check
        n = np.where((n > 0) & (_mem(var, o, n, a, first, k == 1) > cap), n - 1, n)
        up = np.minimum(n + 1, problem.num_layers)
        n = np.where((up > n) & (_mem(var, o, up, a, first, k == 1) <= cap), up, n)
    n = np.where(base > cap, 0, n)
    return n.astype(np.int64)


def max_layers_time(lt: np.ndarray, extra: np.ndarray, tau_ub: float | None, L: int) -> np.ndarray:
    """Largest n with n * layer_time + extra <= tau_ub (eq. X1)."""
    if tau_ub is None or not np.isfinite(tau_ub):
        return np.full(len(lt), L, np.int64)
    room = tau_ub * (1 + TIME_RTOL) - extra  # slack keeps the hint feasible
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.where(lt > 0, np.floor(room / np.where(lt > 0, lt, 1.0)), np.where(room >= 0, L, -1))
    return np.clip(n, -1, L).astype(np.int64)


def usable_options(problem: Problem, v: int) -> np.ndarray:
    var = problem.variants[v]
    ok = [i for i in range(problem.num_options) if var.allowed[i]
          and all(n <= problem.group_capacity[g] for g, n in problem.options[i].usage)]
    return np.asarray(ok, dtype=np.int64)


def time_dominance(problem: Problem, opts: np.ndarray, coef: dict) -> np.ndarray:
    """D[a, b]: option a time-dominates option b (eq. D1): same p2p endpoint, no more GPUs of any group, no
    larger time coefficient, same (tp, dp, recompute) under U1 and same tp under U2; ties broken by index.
    Memory is not compared: b stays usable, but only with more layers than a can hold (the ``lo``
    bounds). Not presolve's ``_drop_outclassed``, which removes options outright."""
    op = [problem.options[i] for i in opts]
    grp = np.array([o.endpoint for o in op])
    use = problem.usage_matrix[opts]
    tp = np.array([o.tp for o in op])
    le = (grp[:, None] == grp[None, :]) & (use[:, None, :] <= use[None, :, :]).all(axis=2)
    strict = (use[:, None, :] < use[None, :, :]).any(axis=2)
    for key in COEF_KEYS:
        c = coef[key]
        le &= c[:, None] <= c[None, :]
        strict |= c[:, None] < c[None, :]
    if problem.uniform:
        sig = np.array([hash(o.signature) for o in op])
        le &= sig[:, None] == sig[None, :]
    if problem.same_tp_first_last:
        le &= tp[:, None] == tp[None, :]
    idx = np.arange(len(op))
    return le & (strict | (idx[:, None] < idx[None, :]))


# The tables' memory part (usable options, coefficients, U_mem, time dominance and its lo bounds) does not
# depend on the time cut-off; the branch and bound builds tables per node, so it is kept for the last problem
# seen. Measured: mixtral-8x7b on 4096 GPUs x 3 types (1278 options) 0.11 s per node, most of it the [n, n]
# dominance matrix, before this. Eq. S2f: it reads only the variant and the problem's options, capacities, layer
# and stage counts and uniform rules, so it is kept per Variant object for the problems sharing those (by identity:
# the planner's variant subset for the exact search after the DP heuristic, ``planner._restrict``, rebuilt every
# table the DP had built: 218 of 288 variants with every dimension on, llama3-8b on 16 H100).
# (per thread: two solves running at once in one process, e.g. through the Python API, never share it)
# (Sailor's 32+96 rows: 54-71 variants, 0.5-0.9 s a pass at load 5, saved by this.)
_MEMO = worker.carry(threading.local())  # (a forked worker's serving thread starts with it: ``worker.carry``)


def _memory_part(problem: Problem, v: int) -> dict:
    memo = _MEMO.__dict__
    var = problem.variants[v]
    base = (problem.group_capacity, problem.num_layers, problem.max_stages, problem.uniform,
            problem.same_tp_first_last)
    if memo.get("options") is not problem.options or memo.get("base") != base:
        memo["options"], memo["base"], memo["variants"] = problem.options, base, {}
    hit = memo["variants"].get(id(var))
    if hit is not None and hit[0] is var:  # the entry holds var, so its id is not reused while it lives
        by_index = hit[1]
        if v not in by_index:
            by_index[v] = {**next(iter(by_index.values())), "v": v}
        return by_index[v]
    L, K = problem.num_layers, min(problem.max_stages, problem.num_layers)
    if var.vpp > 1:  # eq. S1f: an interleaved copy has exactly num_stages stages (eq. I5), so slots past it hold none
        K = min(K, var.num_stages)
    opts = usable_options(problem, v)
    coef = {key: np.asarray(getattr(var, key), float)[opts] for key in COEF_KEYS}
    op = [problem.options[i] for i in opts]
    sigs = sorted({o.signature for o in op})
    n = len(opts)
    U_mem = np.zeros((K, n), np.int64)
    Uf_mem = np.zeros((K, n), np.int64)
    for k in range(1, K + 1):
        U_mem[k - 1] = max_layers_mem(problem, v, opts, k, first=False)
        Uf_mem[k - 1] = max_layers_mem(problem, v, opts, k, first=True)
    D = time_dominance(problem, opts, coef) if n else np.zeros((0, 0), bool)
    lo = np.ones((K, n), np.int64)
    lof = np.ones((K, n), np.int64)
    if n > 1:
        masked = np.where(D[None, :, :], U_mem[:, :, None], 0)  # [K, dominator, dominated]
        lo = np.maximum(1, masked.max(axis=1) + 1)
        masked_f = np.where(D[None, :, :], Uf_mem[:, :, None], 0)
        lof = np.maximum(1, masked_f.max(axis=1) + 1)
    out = {"v": v, "M": var.num_microbatches, "L": L, "K": K, "opts": opts,
           "group": np.array([o.endpoint for o in op], np.int64), "gpus": np.array([o.num_gpus for o in op], np.int64),
           "use": problem.usage_matrix[opts],
           "tp": np.array([o.tp for o in op], np.int64), "sig": np.array([sigs.index(o.signature) for o in op], np.int64),
           "coef": coef, "p2p": np.asarray(var.p2p_time, float), "U_mem": U_mem, "Uf_mem": Uf_mem, "lo": lo, "lof": lof,
           "dom": D, "vpp": var.vpp, "num_stages": var.num_stages}
    memo["variants"][id(var)] = (var, {v: out})
    return out


def build_tables(problem: Problem, v: int, tau_ub: float | None = None) -> Tables:
    """Slot tables of variant v; ``tau_ub`` (an upper bound on max_j t_j that any plan better
    than the incumbent satisfies, eq. X1) tightens the layer bounds."""
    base = _memory_part(problem, v)
    coef, L, K = base["coef"], base["L"], base["K"]
    lt, ft, xt = coef["layer_time"], coef["first_time"], coef["last_time"]
    send_in, send_out = _blocking_sends(problem, base)
    cap_t = max_layers_time(lt, SEND_SHARE * (send_in + send_out), tau_ub, L)  # slots k >= 2: no last-stage extra
    U = np.minimum(base["U_mem"], cap_t[None, :])
    Uf = np.minimum(base["Uf_mem"], max_layers_time(lt, ft + END_SEND_SHARE * send_out, tau_ub, L)[None, :])
    if K:
        U[0] = np.minimum(base["U_mem"][0], max_layers_time(lt, xt + END_SEND_SHARE * send_in, tau_ub, L))
        Uf[0] = np.minimum(base["Uf_mem"][0], max_layers_time(lt, ft + xt, tau_ub, L))
    t = Tables(**base, U=U, Uf=Uf, p_min=0, p_max=0, tau_ub=tau_ub)
    stage_count_bounds(problem, t)
    return t


def subset(t: Tables, keep: np.ndarray) -> Tables:
    """The tables with only the options ``keep`` ([n] bool; local indices renumbered, ``opts`` maps them to the
    problem's), their stage-count range left to the caller (``stage_count_bounds``)."""
    idx = np.flatnonzero(keep)
    cols = {name: getattr(t, name)[:, idx] for name in ("U_mem", "Uf_mem", "U", "Uf", "lo", "lof")}
    return dataclasses.replace(t, opts=t.opts[idx], group=t.group[idx], gpus=t.gpus[idx], use=t.use[idx],
                               tp=t.tp[idx], sig=t.sig[idx], coef={k: v[idx] for k, v in t.coef.items()},
                               dom=None if t.dom is None else t.dom[np.ix_(idx, idx)], **cols)


def _blocking_sends(problem: Problem, base: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per option, the least boundary time into it from an earlier stage and out of it to a later one (eq. X1
    under eq. T2b, X1b): with blocking sends every plan has tau >= t_j + e_j (c_{j-1} + c_j), so a stage whose
    neighbours exist carries at least e_j times its cheapest links on top of t_j; zeros without blocking sends.
    The least runs over the endpoints some usable option has (a neighbour is one of them)."""
    n = len(base["opts"])
    if not problem.p2p_blocking or n == 0:
        return np.zeros(n), np.zeros(n)
    p2p, ends = base["p2p"], np.unique(base["group"])
    sub = p2p[np.ix_(ends, ends)]  # [earlier, later] among the endpoints in use
    into = dict(zip(ends.tolist(), sub.min(axis=0).tolist()))  # least c over earlier endpoints, per later one
    out = dict(zip(ends.tolist(), sub.min(axis=1).tolist()))
    return (np.array([into[e] for e in base["group"].tolist()]), np.array([out[e] for e in base["group"].tolist()]))


def link_half(p2p, crossings: int):
    """The least tau a link of c seconds (a number or an [E, E] array) allows, ``crossings`` transfers of c/2 each way
    per micro-batch: 1 between two neighbouring stages (eq. T2), vpp on an interleaved variant (eq. I2; the wrap, last
    stage to first, vpp - 1); fewer than 1 counts as 1."""
    return p2p * (max(1, crossings) / 2)


def send_floor(problem: Problem, t: Tables) -> np.ndarray:
    """Per option, the least blocking-send time on top of t_j that a stage of it carries in any pipeline of two or
    more stages (eq. T2b, X1b): the first stage END_SEND_SHARE times its way out, the last its way in, one between
    SEND_SHARE times both; zeros without blocking sends."""
    send_in, send_out = _blocking_sends(problem, {"opts": t.opts, "p2p": t.p2p, "group": t.group})
    return np.minimum(END_SEND_SHARE * np.minimum(send_in, send_out), SEND_SHARE * (send_in + send_out))


def stage_count_bounds(problem: Problem, t: Tables) -> None:
    """p_min: the fewest stages whose best per-slot capacities reach L (eq. P1); p_max: no
    more stages than GPUs allow (one option each) nor than slots where some option fits."""
    if t.n == 0:
        t.p_min, t.p_max = 0, 0
        return
    # every stage uses at least the fewest GPUs any option takes of one of its groups
    per_group = {}
    for g in range(t.use.shape[1]):
        col = t.use[:, g][t.use[:, g] > 0]
        if len(col):
            per_group[g] = int(col.min())
    gpu_cap = sum(problem.group_capacity[g] // d for g, d in per_group.items())
    t.p_max = int(min(t.K, t.L, gpu_cap))
    best_nf = np.where(t.lo <= t.U, t.U, 0).max(axis=1)  # [K]
    best_f = np.where(t.lof <= t.Uf, t.Uf, 0).max(axis=1)
    t.p_min = 0
    for p in range(1, t.p_max + 1):
        fits = best_f[p - 1] >= 1 and (p == 1 or best_nf[: p - 1].min() >= 1)
        if fits and best_nf[: p - 1].sum() + best_f[p - 1] >= t.L:
            t.p_min = p
            break
    if t.p_min == 0:
        t.p_max = 0
        return
    while t.p_max > t.p_min and (best_f[t.p_max - 1] < 1 or best_nf[: t.p_max - 1].min() < 1):
        t.p_max -= 1
    if t.vpp > 1:  # eq. I5: an interleaved variant has exactly num_stages stages
        ok = t.p_min <= t.num_stages <= t.p_max
        t.p_min = t.p_max = t.num_stages if ok else 0
