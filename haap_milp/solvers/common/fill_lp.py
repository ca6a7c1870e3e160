"""Eq. B2e: the pipeline's compute sum on a fixed stage count, bounded by a small LP over the options.

Eq. B2's rest term prices sum_j t_j at L layers on the fastest option (L min_o lambda_o). A variant that fixes its
stage count P (an interleaved copy, eq. I5) cannot do that: its P stages each hold a layer at least and share the
groups' GPUs, so the fast options (many GPUs each) can take few of them. With k_o stages of option o holding x_o
layers in all:

    min  sum_o lambda_o x_o
    s.t. sum_o x_o = L,  sum_o k_o = P,  k_o <= x_o <= h_o k_o,  sum_o u_og k_o <= cap_g (every group g),  x, k >= 0

(h_o: the most layers a stage of o holds in memory, u_og: its GPUs of group g, eq. G1) is at most sum_j n_j
lambda_{o_j} for every plan of the variant (its stages give an integral point), so sum_j t_j is at least the LP's
value plus the least first- and last-stage extras. Measured on qwen3-235b-a22b x hetero3-1024 (the CLI's space):
variant M 64 x vpp 2 x 32 stages 0.600 -> 1.665 s of fill, its bound 7.78 -> 8.31 s against the 8.10 s optimum (the
variant closes at the root); M 64 x vpp 4 x 16 stages, the optimum's own, 7.65 -> 7.75 s.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from haap_milp.problem import Problem
from haap_milp.solvers.common import lp
from haap_milp.solvers.common.slot_bounds import Tables

FILL_RTOL = 1e-7  # the LP's value is lowered by this much (relative, and as much in seconds): HiGHS' tolerances
_CACHE = threading.local()  # .by_key: {(id(variant), id(options), capacities, L, P): (variant, options, value)}
CACHE_SIZE = 1024


def fixed_count_fill(problem: Problem, t: Tables) -> float | None:
    """The LP's least sum_o lambda_o x_o for the variant's ``t.num_stages`` stages (seconds; +inf: no fractional
    point, so no plan), or None when HiGHS gives no answer. Kept per variant: the DP heuristic and the search ask for
    the same variants (about 3 ms an LP on 200 options)."""
    var = problem.variants[t.v]
    key = (id(var), id(problem.options), tuple(problem.group_capacity), t.L, t.num_stages)
    cache = _CACHE.__dict__.setdefault("by_key", {})
    hit = cache.get(key)
    if hit is not None and hit[0] is var and hit[1] is problem.options:  # (held: their ids are not reused)
        return hit[2]
    value = _solve(problem.group_capacity, t, t.U_mem[: t.p_max].max(axis=0), t.num_stages)
    if len(cache) >= CACHE_SIZE:
        cache.clear()
    cache[key] = (var, problem.options, value)
    return value


def _frontier(t: Tables, hmax: np.ndarray) -> np.ndarray:
    """The options no other of the same GPUs (the same row of ``t.use``) beats on both lambda and h: the LP never needs
    a beaten one (its beater takes its place at no more cost)."""
    keys = [row.tobytes() for row in t.use]
    lt = t.coef["layer_time"]
    keep, last, best = [], None, -1
    for o in sorted(range(t.n), key=lambda o: (keys[o], lt[o], -hmax[o])):
        if keys[o] != last:
            last, best = keys[o], -1
        if hmax[o] > best:
            keep.append(o)
            best = hmax[o]
    return np.array(sorted(keep), np.int64)


def _solve(group_capacity, t: Tables, hmax: np.ndarray, count: int) -> float | None:
    if lp.highspy is None or t.n == 0:
        return None
    hs = lp.highspy
    keep = _frontier(t, hmax)
    n, inf = len(keep), hs.kHighsInf
    lt, h_k, use = t.coef["layer_time"][keep], hmax[keep].astype(float), t.use[keep]
    model = hs.Highs()
    model.setOptionValue("output_flag", False)
    model.setOptionValue("time_limit", 1.0)
    model.addVars(2 * n, np.zeros(2 * n), np.full(2 * n, inf))  # x_0..x_{n-1}, then k_0..k_{n-1}
    model.changeColsCost(2 * n, np.arange(2 * n, dtype=np.int32), np.r_[lt, np.zeros(n)])
    x, k = np.arange(n), n + np.arange(n)
    groups = [g for g in range(len(group_capacity)) if use[:, g].any()]
    lo = np.r_[t.L, count, np.full(n, -inf), np.zeros(n), np.full(len(groups), -inf)]
    up = np.r_[t.L, count, np.zeros(n), np.full(n, inf), np.asarray([group_capacity[g] for g in groups], float)]
    pairs = np.stack([x, k], axis=1).ravel()
    idx = np.concatenate([x, k, pairs, pairs] + [k[use[:, g] > 0] for g in groups])
    val = np.concatenate([np.ones(2 * n), np.stack([np.ones(n), -h_k], axis=1).ravel(),  # x_o - h_o k_o <= 0
                          np.tile([1.0, -1.0], n)]  # x_o - k_o >= 0
                         + [use[use[:, g] > 0, g].astype(float) for g in groups])  # eq. G1
    sizes = np.r_[n, n, np.full(2 * n, 2), [int((use[:, g] > 0).sum()) for g in groups]]
    starts = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int32)
    model.addRows(len(lo), lo, up, len(idx), starts, idx.astype(np.int32), val)
    lp.run(model)
    status = model.getModelStatus()
    if status == hs.HighsModelStatus.kInfeasible:
        return math.inf
    if status != hs.HighsModelStatus.kOptimal:
        return None
    value = float(model.getInfo().objective_function_value)
    return max(0.0, value * (1 - FILL_RTOL) - FILL_RTOL)
