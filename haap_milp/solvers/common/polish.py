"""Local search on a plan (eq. LS1 of formulations/dp.md): the DP heuristic's last step and the
exact solvers' incumbent improver.

Moves, each kept only if the plan stays feasible (``problem.violations``) and ``evaluate``
drops: change one stage's option; move one layer to another stage; split a stage in two with
the same option; merge two neighbouring stages into one with either option. First
improvement, deterministic order, stopped by a time budget.
"""

from __future__ import annotations

import time

import numpy as np

from haap_milp.problem import Assignment, Problem, Stage, evaluate, violations


def _feasible_better(problem: Problem, a: Assignment, best: float) -> float | None:
    if not a.stages or len(a.stages) > problem.max_stages or any(s.num_layers < 1 for s in a.stages):
        return None
    obj = evaluate(problem, a)
    if obj < best * (1 - 1e-12) and not violations(problem, a):
        return obj
    return None


def _option_moves(a: Assignment, opts: np.ndarray):
    for j, st in enumerate(a.stages):
        for o in opts.tolist():
            if o != st.option:
                yield Assignment(a.variant, a.stages[:j] + (Stage(o, st.num_layers),) + a.stages[j + 1:])


def _layer_moves(a: Assignment):
    p = len(a.stages)
    for j in range(p):
        if a.stages[j].num_layers < 2:
            continue
        for q in range(p):
            if q == j:
                continue
            st = list(a.stages)
            st[j] = Stage(st[j].option, st[j].num_layers - 1)
            st[q] = Stage(st[q].option, st[q].num_layers + 1)
            yield Assignment(a.variant, tuple(st))


def _shape_moves(a: Assignment):
    st = a.stages
    for j, s in enumerate(st):  # split
        for n1 in range(1, s.num_layers):
            yield Assignment(a.variant, st[:j] + (Stage(s.option, n1), Stage(s.option, s.num_layers - n1)) + st[j + 1:])
    for j in range(len(st) - 1):  # merge
        n = st[j].num_layers + st[j + 1].num_layers
        for o in {st[j].option, st[j + 1].option}:
            yield Assignment(a.variant, st[:j] + (Stage(o, n),) + st[j + 2:])


def polish(problem: Problem, a: Assignment, time_limit_s: float = 0.5) -> Assignment:
    """A plan no worse than ``a`` (``a`` itself if it is infeasible)."""
    if violations(problem, a):
        return a
    deadline = time.perf_counter() + time_limit_s
    var = problem.variants[a.variant]
    opts = np.flatnonzero(var.allowed)
    best, best_obj = a, evaluate(problem, a)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for gen in (_layer_moves(best), _option_moves(best, opts), _shape_moves(best)):
            for cand in gen:
                obj = _feasible_better(problem, cand, best_obj)
                if obj is not None:
                    best, best_obj, improved = cand, obj, True
                    break
                if time.perf_counter() > deadline:
                    return best
            if improved:
                break
    return best
