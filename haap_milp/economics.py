"""Money and energy of a plan: the one home of eqs. E1-E7 (formulations/README.md, "Cost and energy").

Notation: stage j uses g_j GPUs (tp * dp * cp) of type k_j; p_k $ per GPU-hour and idle_k, tdp_k W from the
price book (``catalog/prices.py``); T the iteration time (s), M micro-batches, t_j the stage's fwd+bwd time of
one micro-batch (s), N = global batch x sequence tokens per iteration::

    R_usd   = sum_j g_j p_k                                       $ / hour of the GPUs the plan uses   (E1)
    usd/it  = T R_usd / 3600,   usd per 1e6 tokens = usd/it / N * 1e6                              (E2)
    u_j     = min(1, M t_j / T)           compute-busy share of the iteration (sync, optimizer left out)
    P_j     = idle_k + (tdp_k - idle_k) u_j                       W per GPU of stage j             (E3)
    E       = T sum_j g_j P_j = T R_idle + D,  R_idle = sum_j g_j idle_k,
              D = sum_j g_j (tdp_k - idle_k) M t_j   (u_j <= 1 always under eq. T1: T >= M max t)  (E4)
    J/token = E / N                                                                                (E5)

GPUs of the cluster the plan leaves idle are not counted: the cluster is a pool to draw from (eq. G1 is
``<=``), and what is not used is not rented. The linear rows the solvers see are eq. W1 (``problem.Budget``)
with per-option integer weights (``option_weights``); eq. E6 (E6b under a budget) is the lower bound of D used
for the energy gap, and eq. E7 (``inflated_problem``) a second one, through one more time solve per band.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from haap_milp.catalog.prices import PriceBook
from haap_milp.problem import Budget, Problem

USD_UNIT = 1e-4  # $ per hour: one unit of the cost budget row (eq. W1); prices are rounded to it per GPU
WATT_UNIT = 0.1  # W: one unit of the idle-power budget row; idle power is rounded to it per GPU
MEASURES = ("cost", "energy")


def stage_type_gpus(plan) -> list[list[tuple[str, int]]]:
    """Per stage, (GPU type, GPUs) of each of its replica types (one pair for a single-type stage; a mixed
    stage, eq. H1, one per replica type), context parallelism included."""
    return [[(r.gpu_type, r.tp * r.count * plan.cp) for r in s.replicas] if s.replicas
            else [(s.gpu_type, s.num_gpus * plan.cp)] for s in plan.stages]


def gpus_by_type(plan) -> dict[str, int]:
    """GPUs the plan uses per GPU type (a mixed stage's replica types counted apart)."""
    out: dict[str, int] = {}
    for stage in stage_type_gpus(plan):
        for k, n in stage:
            out[k] = out.get(k, 0) + n
    return out


def missing(plan_types, book: PriceBook, measure: str) -> list[str]:
    """GPU types without the number ``measure`` needs (a price of the book's kind, or a TDP)."""
    get = book.usd_per_gpu_hour if measure == "cost" else book.tdp_w
    return sorted({k for k in plan_types if get(k) is None})


def usd_per_hour(plan, book: PriceBook) -> float | None:
    """Eq. E1 (None when a GPU type of the plan has no price)."""
    pairs = [pair for stage in stage_type_gpus(plan) for pair in stage]
    prices = [book.usd_per_gpu_hour(k) for k, _ in pairs]
    if any(p is None for p in prices):
        return None
    return float(sum(g * p for (_, g), p in zip(pairs, prices)))


def energy_parts(plan, stage_times_s: list[float], iteration_time_s: float, book: PriceBook):
    """(R_idle W, D J, E J) of eq. E4, or None when a GPU type has no TDP."""
    per_stage = stage_type_gpus(plan)
    if any(book.tdp_w(k) is None for stage in per_stage for k, _ in stage):
        return None
    m, t_iter = plan.num_microbatches, iteration_time_s
    busy = [min(1.0, m * t / t_iter) if t_iter > 0 else 0.0 for t in stage_times_s]  # u_j of eq. E3
    # every replica type of a mixed stage is charged the stage's busy share u_j (its slowest type's):
    # an upper estimate for the faster types, which wait on the slowest at each micro-batch's sync
    r_idle = sum(g * book.idle_w(k) for stage in per_stage for k, g in stage)
    dyn = sum(g * (book.tdp_w(k) - book.idle_w(k)) * u * t_iter
              for stage, u in zip(per_stage, busy) for k, g in stage)
    return r_idle, dyn, t_iter * r_idle + dyn


def plan_economics(plan, estimate, book: PriceBook) -> dict:
    """The JSON fields every plan reports (None where the price book has no number for a GPU type):
    ``usd_per_hour``, ``usd_per_iteration``, ``usd_per_million_tokens``, ``average_power_w``,
    ``joules_per_iteration``, ``joules_per_token`` (eqs. E1-E5) and ``price_kind``."""
    out = dict.fromkeys(("usd_per_hour", "usd_per_iteration", "usd_per_million_tokens", "average_power_w",
                         "joules_per_iteration", "joules_per_token"))
    out["price_kind"] = book.kind
    if plan is None or estimate is None:
        return out
    t_iter = float(estimate.iteration_time_s)
    tokens = plan.global_batch_size * plan.seq_len
    rate = usd_per_hour(plan, book)
    if rate is not None:
        usd = t_iter * rate / 3600.0
        out.update(usd_per_hour=rate, usd_per_iteration=usd, usd_per_million_tokens=usd / tokens * 1e6)
    parts = energy_parts(plan, [s.time_s for s in estimate.stages], t_iter, book)
    if parts is not None:
        energy = parts[2]
        out.update(average_power_w=energy / t_iter if t_iter > 0 else None, joules_per_iteration=energy,
                   joules_per_token=energy / tokens)
    return out


def option_weights(problem: Problem, group_types: list[str], book: PriceBook, measure: str) -> np.ndarray:
    """Eq. W1's integer weight per option: its GPUs x (price in USD_UNIT, cost) or (idle W in WATT_UNIT,
    energy). Rounded per GPU, so a plan's weight is exactly its GPUs' rounded rate. Raises KeyError naming
    the GPU type without a number (callers check ``missing`` first)."""
    per_gpu = []
    for k in group_types:
        v = book.usd_per_gpu_hour(k) / USD_UNIT if measure == "cost" else book.idle_w(k) / WATT_UNIT
        per_gpu.append(round(v))
    return np.array([sum(n * per_gpu[g] for g, n in o.usage) for o in problem.options], np.int64)


def budget(problem: Problem, weights: np.ndarray, limit: int, measure: str) -> Budget:
    """Eq. W1 with the weights divided by their greatest common divisor (smaller coefficients for HiGHS;
    floor(limit / gcd) keeps exactly the same plans)."""
    g = int(np.gcd.reduce(weights[weights > 0])) if (weights > 0).any() else 1
    return Budget(weights // g, int(limit // g), name=f"{measure} rate")


def rate_of(weights: np.ndarray, options) -> int:
    """A plan's eq. W1 left-hand side in the unweighted integer unit (USD_UNIT or WATT_UNIT)."""
    return int(sum(int(weights[o]) for o in options))


def dynamic_energy_lb(problem: Problem, group_types: list[str], book: PriceBook, weights: np.ndarray | None = None,
                      limit: int | None = None) -> float:
    """Eq. E6: a lower bound (J) on D of eq. E4 over every plan of the problem. D = M sum_j g_j dP_j t_j and
    t_j = n_j layer_time + extras, so D >= min over variants of M (L min_o g_o dP_o layer_time_o + min_o g_o
    dP_o first_time_o + min_o g_o dP_o last_time_o) over the options the variant allows. With eq. W1's
    ``weights`` and ``limit`` (eq. E6b): only options with w_o <= limit can be in a plan within the budget,
    so the minima run over those (never below the unbudgeted bound)."""
    gdp = dynamic_rate(problem, group_types, book)
    within = np.ones(len(problem.options), bool) if weights is None or limit is None else np.asarray(weights) <= limit
    best = math.inf
    for v in problem.variants:
        ok = np.asarray(v.allowed, bool) & within
        if not ok.any():
            continue
        w = gdp[ok]
        d = (problem.num_layers * (w * v.layer_time[ok]).min() + (w * v.first_time[ok]).min()
             + (w * v.last_time[ok]).min())
        best = min(best, v.num_microbatches * d)
    return 0.0 if not math.isfinite(best) else float(best)


def dynamic_rate(problem: Problem, group_types: list[str], book: PriceBook) -> np.ndarray:
    """rho_o = sum_g g_o,g (tdp_g - idle_g) per option (W): D of eq. E4 is M sum_j rho_j t_j."""
    dp = np.array([book.tdp_w(k) - book.idle_w(k) for k in group_types])
    return np.array([sum(n * dp[g] for g, n in o.usage) for o in problem.options], float)


def inflated_problem(problem: Problem, group_types: list[str], book: PriceBook, r_lo_w: float) -> Problem:
    """Eq. E7: the Problem whose stage-time arrays of option o are scaled by 1 + rho_o / R_lo (R_lo in W).

    Its iteration time T' satisfies T'(a) <= T(a) + D(a) / R_lo for every plan a: T1's tau rows have
    coefficients in [0, 1] and sigma does not grow with t, so dT/dt_j <= M, and the scaled t_j grow by
    rho_j t_j / R_lo, in sum D / (M R_lo). Hence every plan with R_idle(a) >= R_lo has
    E(a) = T R_idle + D >= R_lo (T + D / R_lo) >= R_lo T'(a): R_lo times a lower bound of min T' under the
    budget row bounds the energy of every plan of the band [R_lo, B] (eq. F2E)."""
    k = 1.0 + dynamic_rate(problem, group_types, book) / r_lo_w
    return replace(problem, variants=tuple(
        replace(v, layer_time=v.layer_time * k, first_time=v.first_time * k, last_time=v.last_time * k)
        for v in problem.variants))
