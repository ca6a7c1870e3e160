"""Eq. N2d: a node's LP optimum carried to its children, so that a child whose LP cannot lift its bound skips it.

A child's plans are a subset of its parent's, so the parent's LP value bounds them too (the child inherits it). If
the parent's LP point ``x*`` is also a point of the child's own LP (the child's model, rebuilt on its tables, with
its variables' bounds and rows) and the child's objective there is at most the child's bound, then the child's LP
optimum is at most that bound: solving it cannot lift the bound, and it is skipped. Exact whatever the tolerances:
skipping an LP never makes a bound invalid, it only forgoes a lift (here one of at most the tolerances below).

The point is keyed by what each variable means, not by its column, because a child's model numbers its variables
afresh: slot variables by (kind, slot k, the problem's option id), the links' transport variables by their
endpoints, the stage-count indicators by k. A variable of the point that the child's model lacks must equal the
constant the child's model has there: used[k] is 1 for k <= p_min (no variable), every other absent variable 0.
"""

from __future__ import annotations

import numpy as np

from haap_milp.solvers.common.model import LinModel

FEAS_TOL = 1e-6  # absolute, per unit of max(1, |side|): HiGHS' primal tolerance is 1e-7
OBJ_RTOL = 1e-6  # the child's objective at the point may exceed its bound by this share (a lift no larger is forgone;
# the bound itself is the LP value less 1e-7 of it, branch_and_bound._lp_value)


def _keys(lm: LinModel) -> list:
    """Each variable of ``lm``'s meaning (column order)."""
    keys: list = [None] * len(lm.names)
    opts = lm.t.opts
    for kind, store in (("xn", lm.xn), ("xf", lm.xf), ("n", lm.nv)):
        for (k, i), v in store.items():
            keys[v] = (kind, k, int(opts[i]))
    for k, v in lm.used.items():
        keys[v] = ("used", k)
    for s, v in lm.w.items():
        keys[v] = ("w", s)
    for kind, store in (("z", lm.z), ("zw", lm.zw)):
        for idx, v in store.items():
            keys[v] = (kind, *idx)
    keys[lm.tau], keys[lm.sigma] = ("tau",), ("sigma",)
    return keys


def keyed(lm: LinModel, x) -> dict:
    """The LP solution ``x`` (values in ``lm``'s column order) as {meaning: value}, zeros left out."""
    x = np.asarray(x, float)[: len(lm.names)]
    return {key: float(val) for key, val in zip(_keys(lm), x.tolist(), strict=True) if val != 0.0}


def holds(lm: LinModel, point: dict, bound: float) -> bool:
    """Whether ``point`` (``keyed``'s) lies in ``lm``'s LP (its bounds and rows, within FEAS_TOL) with objective at
    most ``bound`` (within OBJ_RTOL): then that LP's optimum is at most ``bound``."""
    keys = _keys(lm)
    if any(k is None for k in keys):  # (a variable of a kind this module does not know: never skip)
        return False
    x = np.array([point.get(k, 0.0) for k in keys])
    present = set(keys)
    for key, val in point.items():  # the point's variables that this model has as constants
        want = 1.0 if key[0] == "used" and key[1] <= lm.t.p_min else 0.0
        if key not in present and abs(val - want) > FEAS_TOL:
            return False
    lb, ub = np.asarray(lm.lb, float), np.asarray(lm.ub, float)
    if np.any(x < lb - FEAS_TOL * np.maximum(1.0, np.abs(lb))) or np.any(x > ub + FEAS_TOL * np.maximum(1.0, np.abs(ub))):
        return False
    obj, const = lm.objective()
    value = sum(c * x[v] for v, c in obj.items()) + const
    if value > bound + OBJ_RTOL * max(1.0, abs(bound)):
        return False
    rid, var, coef = lm.dense(lm.rows)
    act = np.bincount(rid, coef * x[var], minlength=len(lm.rows)) + np.array([r.const for r in lm.rows])
    lo = np.array([r.lb for r in lm.rows], float)
    hi = np.array([r.ub for r in lm.rows], float)
    with np.errstate(invalid="ignore"):  # (infinite sides)
        ok = (act >= lo - FEAS_TOL * np.maximum(1.0, np.abs(lo))) & (act <= hi + FEAS_TOL * np.maximum(1.0, np.abs(hi)))
    return bool(ok.all())
