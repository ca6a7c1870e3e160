"""Eq. B2e: the pipeline's compute sum on a fixed stage count, bounded by a small LP over the options.

Eq. B2's rest term prices sum_j t_j at L layers on the fastest option (L min_o lambda_o). A variant that fixes its
stage count P (an interleaved copy, eq. I5) cannot do that: its P stages each hold a layer at least and share the
groups' GPUs, so the fast options (many GPUs each) can take few of them. With k_o stages of option o holding x_o
layers in all:

    min  sum_o lambda_o x_o
    s.t. sum_o x_o = L,  sum_o k_o = P,  k_o <= x_o <= h_o k_o,  sum_o u_og k_o <= cap_g (every group g),  x, k >= 0

(h_o: the most layers a stage of o holds in memory, u_og: its GPUs of group g, eq. G1; built as a LinModel for
lp.py, the one highspy model builder) is at most sum_j n_j
lambda_{o_j} for every plan of the variant (its stages give an integral point), so sum_j t_j is at least the LP's
value plus the least first- and last-stage extras. Measured on qwen3-235b-a22b x hetero3-1024 (the CLI's space):
variant M 64 x vpp 2 x 32 stages 0.600 -> 1.665 s of fill, its bound 7.78 -> 8.31 s against the 8.10 s optimum (the
variant closes at the root); M 64 x vpp 4 x 16 stages, the optimum's own, 7.65 -> 7.75 s.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from haap_milp import worker
from haap_milp.problem import Problem
from haap_milp.solvers.common import lp
from haap_milp.solvers.common.model import LinModel
from haap_milp.solvers.common.slot_bounds import Tables

FILL_RTOL = 1e-7  # the LP's value is lowered by this much (relative, and as much in seconds): HiGHS' tolerances
_CACHE = worker.carry(threading.local())  # .by_key: {(id(variant), id(options), capacities, L, P): (variant, options, value)}
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
    value = _solve(problem.group_capacity, t, memory_layers(t), (t.num_stages, t.num_stages))
    if len(cache) >= CACHE_SIZE:
        cache.clear()
    cache[key] = (var, problem.options, value)
    return value


def memory_layers(t: Tables) -> np.ndarray:
    """[n] the most layers a stage of each option holds in memory at any of the variant's stage places (eq. M2)."""
    return t.U_mem[: t.p_max].max(axis=0)


def capped_fill(problem: Problem, t: Tables, h: np.ndarray) -> float | None:
    """Eq. B2i: eq. B2e's LP with each option's stages holding at most ``h`` layers, the layers a stage of o holds
    within a period cap (``bounds.capped_rest``: a stage of n layers takes t_j >= n lambda_o, and tau >= t_j, eqs. T2,
    I2): its value bounds sum_j n_j lambda_{o_j} for every plan of the variant within that cap (+inf: none is). A
    plain variant (no fixed stage count) takes p_min <= sum_o k_o <= p_max. Not kept: the cap moves with the
    incumbent."""
    count = (t.num_stages, t.num_stages) if t.num_stages else (t.p_min, t.p_max)  # (a plain variant: eq. P1's range)
    return _solve(problem.group_capacity, t, h, count)


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


def _solve(group_capacity, t: Tables, hmax: np.ndarray, count: tuple[int, int]) -> float | None:
    """The LP on ``lp.py``'s builder: a LinModel whose tau and sigma are held at 0 and whose time terms are the
    x_o's lambda_o; ``count``: the least and most stages (sum_o k_o)."""
    keep = _frontier(t, hmax)
    if t.n == 0 or not len(keep):
        return None
    lt, use = t.coef["layer_time"], t.use
    m = LinModel(t)
    m.tau, m.sigma = m.var("tau", 0.0, 0.0, integer=False), m.var("sigma", 0.0, 0.0, integer=False)
    x = {o: m.var(f"x{o}", 0.0, math.inf, integer=False) for o in keep.tolist()}
    k = {o: m.var(f"k{o}", 0.0, math.inf, integer=False) for o in keep.tolist()}
    m.obj_time = {x[o]: float(lt[o]) for o in x}
    m.add({x[o]: 1.0 for o in x}, t.L, t.L, label="B2e sum x = L")
    m.add({k[o]: 1.0 for o in k}, count[0], count[1], label="B2e sum k = P")
    for o, xo in x.items():
        m.add({xo: 1.0, k[o]: -float(hmax[o])}, -math.inf, 0.0, label="B2e x <= h k")
        m.add({xo: 1.0, k[o]: -1.0}, 0.0, math.inf, label="B2e x >= k")
    for g, cap in enumerate(group_capacity):
        on = {k[o]: float(use[o, g]) for o in k if use[o, g] > 0}
        if on:
            m.add(on, -math.inf, float(cap), label="G1")
    got = lp.lp_relaxation(m, None, time_limit_s=1.0)
    if got is None:
        return None
    if not math.isfinite(got.value):
        return math.inf
    return max(0.0, got.value * (1 - FILL_RTOL) - FILL_RTOL)
