"""Exhaustive oracle for tiny instances: every variant x stage count x option per stage x
composition of L. Independent of the other solvers and of ``solvers.common``: it evaluates eqs.
T1, M1, M2, G1, W1, U1, U2 vectorised over all plans of one (variant, stage count), with the closed
forms of ``haap_milp.pipeline`` (stage memory, in-flight count, memory fit, BWD_SHARE, eq. T1's
sum) and its own vectorised tau (eq. T2), and confirms the winner with
``problem.evaluate``/``violations``."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from haap_milp.pipeline import (
    BWD_SHARE,
    TIME_RTOL,
    compose_iteration_time,
    fits_memory,
    inflight,
    inflight_1f1b,
    interleaved_inflight_chunks,
    interleaved_tau_weight,
    interleaved_window_means,
    send_shares,
    stage_memory,
    sync_share,
    window_means,
)
from haap_milp.problem import Assignment, Problem, RawResult, Stage, evaluate, violations

MAX_PLANS = 3_000_000  # refuse (ERROR) above this many (option tuple, composition) pairs


def plan_count(problem: Problem) -> int:
    """How many candidate plans the enumeration visits."""
    total = 0
    for var in problem.variants:
        n = int(np.count_nonzero(var.allowed))
        for p in range(1, min(problem.max_stages, problem.num_layers) + 1):
            total += n**p * math.comb(problem.num_layers - 1, p - 1)
    return total


def compositions(L: int, p: int) -> np.ndarray:
    """All ways to write L as an ordered sum of p positive parts, shape [C, p]."""
    rows = []
    for cuts in itertools.combinations(range(1, L), p - 1):
        b = (0, *cuts, L)
        rows.append([b[i + 1] - b[i] for i in range(p)])
    return np.asarray(rows, dtype=np.int64).reshape(-1, p)


def _best_of(problem: Problem, v: int, p: int):
    """(objective, combo, composition) of the best feasible plan with p stages, or None."""
    var = problem.variants[v]
    allowed = np.flatnonzero(var.allowed)
    if not len(allowed) or (var.vpp > 1 and p != var.num_stages):  # eq. I5: an interleaved variant's P
        return None
    combos = allowed[np.asarray(list(itertools.product(range(len(allowed)), repeat=p)), np.int64)]  # [T, p]
    comp = compositions(problem.num_layers, p).astype(float)  # [C, p]
    ok = _combo_ok(problem, combos)  # [T]
    combos = combos[ok]
    if not len(combos):
        return None
    n = comp[None, :, :]  # [1, C, p]
    first = np.zeros(p, bool)
    first[0] = True
    last = np.zeros(p, bool)
    last[-1] = True

    def col(arr):
        return np.asarray(arr, float)[combos][:, None, :]  # [T, 1, p]

    a = np.array([inflight_1f1b(p - j, var.num_microbatches) if var.vpp <= 1 else
                  inflight("interleaved", j, p, var.num_microbatches, var.vpp) for j in range(p)], float)  # M1, I4
    # the first/last extras masked to their column: x * 1 == x and x * 0 == 0 exactly, so each column
    # gets the same float operations as problem.stage_memory
    mem = stage_memory(col(var.fixed_mem), col(var.layer_static_mem), col(var.layer_act_mem), n, a,
                       (first * col(var.first_static_mem), first * col(var.first_act_mem)),
                       (last * col(var.last_static_mem), last * col(var.last_act_mem)))
    fits = fits_memory(mem, col(var.mem_capacity)).all(axis=2)  # [T, C]  eq. M2
    t = n * col(var.layer_time) + first * col(var.first_time) + last * col(var.last_time)
    s = col(var.sync_fixed) + n * col(var.sync_per_layer) + first * col(var.sync_first) + last * col(var.sync_last)
    grp = np.array([o.endpoint for o in problem.options])[combos]  # [T, p] p2p endpoints (eq. H5)
    c = np.asarray(var.p2p_time, float)[grp[:, :-1], grp[:, 1:]][:, None, :]  # [T, 1, p-1]
    if var.vpp > 1:
        obj = _interleaved(var, t, c, s, np.asarray(var.p2p_time, float)[grp[:, -1], grp[:, 0]][:, None])
        return _argmin(np.where(fits & _fast(problem, obj), obj + _extra(var, col, n, first, last), np.inf), combos,
                       comp)
    steady = np.maximum(t.max(axis=2), c.max(axis=2) / 2 if p > 1 else 0.0)  # eq. T2
    c_pad = np.concatenate([c, np.zeros(c.shape[:2] + (1,))], axis=2)  # [T, 1, p]: c_j for j < p-1
    steady = _largest(steady, window_means(_by_stage(t), _by_stage(c_pad), var.num_microbatches))  # eq. T2
    if problem.p2p_blocking and p > 1:  # eq. T2b: t_j + SEND_SHARE (c_{j-1} + c_j)
        c_prev = np.concatenate([np.zeros(c.shape[:2] + (1,)), c], axis=2)  # [T, 1, p]: c_{j-1}, 0 for j = 0
        share = np.array(send_shares(p))  # the end stages: their one boundary's round trip
        steady = np.maximum(steady, (t + share * (c_prev + c_pad)).max(axis=2))
    before = np.cumsum(t, axis=2) - t  # sum_{k<j} t_k
    sigma = (s - sync_share(problem.p2p_blocking) * before).max(axis=2)  # eq. T3
    obj = compose_iteration_time(var.num_microbatches, steady, t.sum(axis=2), c.sum(axis=2), sigma)  # eq. T1
    return _argmin(np.where(fits & _fast(problem, obj), obj + _extra(var, col, n, first, last), np.inf), combos, comp)


def _by_stage(x) -> list:
    """[T, C or 1, p] -> p arrays [T, C or 1], one per stage (what the pipeline's window generators take)."""
    return [x[:, :, j] for j in range(x.shape[2])]


def _largest(tau, windows):
    """tau raised to each window term of ``windows`` (``pipeline.window_means`` or ``interleaved_window_means`` on
    ``_by_stage`` arrays): eqs. T2 and I7 vectorised."""
    for term, _, _ in windows:
        tau = np.maximum(tau, term)
    return tau


def _fast(problem: Problem, t_iter):
    """Eq. TX1e vectorised: T <= T_max (with problem.over_time's float slack); True without a bound."""
    if problem.max_time_s is None:
        return True
    return t_iter <= problem.max_time_s * (1 + TIME_RTOL)


def _extra(var, col, n, first, last):
    """Eq. EX1 vectorised ([T, C]; 0 when the variant has no extra terms)."""
    x = var.extra
    if x is None:
        return 0.0
    return (col(x.per_stage) + n * col(x.per_layer) + first * col(x.first) + last * col(x.last)).sum(axis=2) + x.const


def _interleaved(var, t, c, s, cw):
    """Eqs. I1-I4 vectorised over [T, C, p] stage times t, [T, 1, p-1] boundaries c, [T, 1] wrap cw."""
    v, p, m = var.vpp, t.shape[2], var.num_microbatches
    c_pad = np.concatenate([c, np.zeros(c.shape[:2] + (1,))], axis=2)  # [T, 1, p]
    suf_t = np.flip(np.cumsum(np.flip(t, axis=2), axis=2), axis=2)  # sum_{i>=j} t_i
    pre_t = t.sum(axis=2, keepdims=True) - suf_t  # sum_{i<j} t_i
    suf_c = np.flip(np.cumsum(np.flip(c_pad, axis=2), axis=2), axis=2)  # sum_{b>=j} c_b
    pre_c = c_pad.sum(axis=2, keepdims=True) - suf_c
    r = ((v + 1) / 2 * suf_t + (v - 1) / 2 * pre_t + v * (v + 1) / 2 * suf_c
         + v * (v - 1) / 2 * (pre_c + cw[:, :, None]))  # eq. I3
    n = np.array([interleaved_inflight_chunks(j, p, m, v) for j in range(p)], float)  # eq. I4
    tau = np.maximum(np.maximum(t.max(axis=2), v * c.max(axis=2, initial=0.0) / 2), (v - 1) * cw / 2)
    tau = np.maximum(tau, (r / n).max(axis=2))  # eq. I2
    tau = _largest(tau, interleaved_window_means(_by_stage(t), _by_stage(c_pad), m, v, cw))  # eq. I7
    before = np.cumsum(t, axis=2) - t
    sigma = (s - BWD_SHARE / v * before).max(axis=2)
    return (interleaved_tau_weight(m, v) * tau + t.sum(axis=2) / v + v * c.sum(axis=2) + (v - 1) * cw
            + sigma)  # eq. I1


def _argmin(obj, combos, comp):
    flat = int(np.argmin(obj))
    ti, ci = divmod(flat, obj.shape[1])
    if not np.isfinite(obj[ti, ci]):
        return None
    return float(obj[ti, ci]), combos[ti], comp[ci].astype(int)


def _combo_ok(problem: Problem, combos: np.ndarray) -> np.ndarray:
    """GPU counts per group (eq. G1), the budget (eq. W1) and the engine rules (eqs. U1, U2) of option tuples."""
    opts = problem.options
    use = np.zeros((len(opts), len(problem.group_capacity)), np.int64)
    for i, o in enumerate(opts):
        for g, n in o.usage:
            use[i, g] += n
    ok = np.ones(len(combos), bool)
    for g, cap in enumerate(problem.group_capacity):  # eq. G1 (a mixed option uses several groups)
        ok &= use[combos, g].sum(axis=1) <= cap
    if problem.budget is not None:  # eq. W1
        used = np.asarray(problem.budget.weight, np.int64)[combos].sum(axis=1)
        ok &= (used <= problem.budget.limit) & (used >= problem.budget.lower)  # eq. W1b: the floor
    if problem.uniform:
        sigs = sorted({o.signature for o in opts})
        sid = np.array([sigs.index(o.signature) for o in opts])[combos]
        ok &= (sid == sid[:, :1]).all(axis=1)
    if problem.same_tp_first_last:
        tp = np.array([o.tp for o in opts])[combos]
        ok &= tp[:, 0] == tp[:, -1]
    return ok


def solve(problem: Problem, options=None, hint: Assignment | None = None) -> RawResult:
    """Exhaustive optimum (OPTIMAL, bound = objective) or INFEASIBLE; ERROR when too large."""
    t0 = time.perf_counter()
    count = plan_count(problem)
    if count > MAX_PLANS:
        return RawResult("ERROR", "brute", message=f"instance too large for brute force ({count} plans > {MAX_PLANS})",
                         stats={"plans": count})
    best = None
    for v in range(len(problem.variants)):
        for p in range(1, min(problem.max_stages, problem.num_layers) + 1):
            got = _best_of(problem, v, p)
            if got is not None and (best is None or got[0] < best[0]):
                best = (got[0], v, got[1], got[2])
    wall = time.perf_counter() - t0
    if best is None:
        return RawResult("INFEASIBLE", "brute", wall_time_s=wall, stats={"plans": count},
                         message="exhaustive enumeration: no plan satisfies memory, GPU counts and engine rules")
    _, v, combo, comp = best
    a = Assignment(v, tuple(Stage(int(o), int(n)) for o, n in zip(combo, comp)))
    bad = violations(problem, a)
    if bad:
        return RawResult("ERROR", "brute", wall_time_s=wall, message=f"internal: optimum violates {bad[0]}")
    obj = evaluate(problem, a)
    return RawResult("OPTIMAL", "brute", assignment=a, objective_s=obj, bound_s=obj, wall_time_s=wall,
                     stats={"plans": count, "vectorised_objective_s": best[0]})
