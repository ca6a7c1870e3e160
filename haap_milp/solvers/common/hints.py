"""Canonical form of a plan: what the exact models accept as a warm start.

Two objective-preserving (or improving) rewrites make any feasible plan satisfy the
dominance bounds (eq. D1) and the symmetry rows (eq. S1) of formulations/README.md.
"""

from __future__ import annotations

import logging

import numpy as np

from haap_milp.problem import Assignment, Problem, Stage, evaluate, violations
from haap_milp.solvers.common.slot_bounds import COEF_KEYS, Tables

log = logging.getLogger(__name__)


def _rank(t: Tables) -> np.ndarray:
    """A strict order compatible with time-dominance (sum of coefficients, GPUs, index)."""
    total = sum(t.coef[k] for k in COEF_KEYS)
    return np.lexsort((np.arange(t.n), t.gpus, total)).argsort()


def replace_dominated(t: Tables, a: Assignment) -> Assignment:
    """Swap each stage's option for a time-dominating option that still holds its layers at its
    slot (eq. D1), until none applies; never slower, never more GPUs of the group."""
    local = {int(o): i for i, o in enumerate(t.opts)}
    rank = _rank(t)
    p = len(a.stages)
    out = []
    for j, st in enumerate(a.stages):
        i, k = local[st.option], p - j
        while True:
            cap = (t.Uf_mem if j == 0 else t.U_mem)[k - 1]
            cand = np.flatnonzero(t.dom[:, i] & (cap >= st.num_layers))
            if not len(cand):
                break
            i = int(cand[np.argmin(rank[cand])])
        out.append(Stage(int(t.opts[i]), st.num_layers))
    return Assignment(a.variant, tuple(out))


def sort_runs(a: Assignment, num_microbatches: int) -> Assignment:
    """Eq. S1: within runs of consecutive non-first stages with the same option and slot
    >= max(2, M), layer counts are non-decreasing in pipeline order (deeper slots hold fewer)."""
    st = list(a.stages)
    p = len(st)
    last_j = p - max(2, num_microbatches)  # pipeline index j has slot p - j >= max(2, M)
    j = 1
    while j <= last_j:
        e = j
        while e + 1 <= last_j and st[e + 1].option == st[j].option:
            e += 1
        counts = sorted(s.num_layers for s in st[j: e + 1])
        for q, n in zip(range(j, e + 1), counts):
            st[q] = Stage(st[q].option, n)
        j = e + 1
    return Assignment(a.variant, tuple(st))


def canonical(problem: Problem, t: Tables, a: Assignment) -> Assignment:
    """replace_dominated then sort_runs; falls back to ``a`` if that would not be better-or-equal
    and feasible (it always is when the tables are right)."""
    if any(st.option not in set(t.opts.tolist()) for st in a.stages):
        return a
    b = sort_runs(replace_dominated(t, a), t.M if t.vpp <= 1 else len(a.stages) + 1)  # no S1 under eq. I3
    if violations(problem, b) or evaluate(problem, b) > evaluate(problem, a) * (1 + 1e-12):
        log.warning("canonical form of the hint is not better; keeping the hint as given")
        return a
    return b
