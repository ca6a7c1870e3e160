"""Robust plans and sensitivity (formulations/README.md, eqs. R1-R3).

Uncertainty model (eq. R1): the estimator's error is in each GPU type's computation — the stage times t_j
(forward + backward of a micro-batch, in-stage TP/EP collectives included, as the estimator prices them) —
while links (p2p c_j) and the DP sync s_j are taken as measured (network profiles, ``--network``). Every
GPU type k may be off by its own factor (1 + d_k), |d_k| <= PCT. T of eq. T1 never decreases when a t_j
grows (tau, the sums and sigma are maxima and sums of t with non-negative weights, BWD_SHARE < 1 aside:
sigma falls with earlier stages' t by at most BWD_SHARE x their increase, which the sum of t_j more than
pays back), so for every plan the worst corner of the box is d_k = +PCT for all k (eq. R2):

    T_wc(a) = T(a; t x (1 + PCT), c, s)

and the min-max plan is the optimum of the Problem whose stage-time arrays are scaled by 1 + PCT (eq. R3).
It differs from the nominal plan when links or sync matter (a slower compute makes a plan that spends more
on communication relatively better). The regret model (min over plans of the worst regret over the 2^types
corners) is not implemented.

Sensitivity (eq. R4): dT/dt_j of a plan, one-sided (T is piecewise linear in t; the right derivative is the
one that matters for "stage j is slower than predicted"), from ``pipeline.iteration_time``, and the
elasticity e_j = (t_j / T) dT/dt_j: +1 % on stage j's time moves T by e_j %.
"""

from __future__ import annotations

from dataclasses import replace

from haap_milp.pipeline import iteration_time
from haap_milp.problem import Assignment, Problem, boundary_times, evaluate, stage_times, sync_times, wrap_time

STEP = 1e-6  # relative step of the one-sided derivative (T is piecewise linear: exact away from a kink)


def worst_case_problem(problem: Problem, pct: float) -> Problem:
    """Eq. R3: the Problem with every stage-time array (layer, first, last) scaled by 1 + pct (pct = 0.1: 10 %)."""
    k = 1.0 + pct
    return replace(problem, variants=tuple(
        replace(v, layer_time=v.layer_time * k, first_time=v.first_time * k, last_time=v.last_time * k)
        for v in problem.variants))


def worst_case_time(problem: Problem, a: Assignment, pct: float) -> float:
    """T_wc of eq. R2 (seconds)."""
    return evaluate(worst_case_problem(problem, pct), a)


def sensitivity(problem: Problem, a: Assignment) -> list[dict]:
    """Eq. R4 per stage: ``{"stage", "dT_dt", "elasticity"}`` (s per s; % of T per % of t_j)."""
    t, c, s = stage_times(problem, a), boundary_times(problem, a), sync_times(problem, a)
    var = problem.variants[a.variant]
    m = var.num_microbatches
    blocking = problem.p2p_blocking  # eq. T2b under runtimes whose sends block (as evaluate)
    # an interleaved variant: eq. I1 with its wrap boundary (as evaluate)
    sched = ("interleaved", var.vpp, wrap_time(problem, a)) if var.vpp > 1 else ("1f1b", 1, 0.0)
    base = iteration_time(t, c, s, m, *sched, blocking=blocking)
    out = []
    for j, tj in enumerate(t):
        h = STEP * max(tj, 1e-12)
        up = list(t)
        up[j] = tj + h
        d = (iteration_time(up, c, s, m, *sched, blocking=blocking) - base) / h
        out.append({"stage": j, "dT_dt": d, "elasticity": d * tj / base if base > 0 else 0.0})
    return out


def most_sensitive(rows: list[dict]) -> dict | None:
    return max(rows, key=lambda r: r["elasticity"]) if rows else None
