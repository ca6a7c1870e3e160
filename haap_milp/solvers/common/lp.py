"""LP relaxation of a node model (eq. N2), solved with HiGHS' simplex through highspy.

The driver uses it to prune (variant, tau interval) nodes cheaply before an exact engine is
run on them; its value is a valid lower bound on every plan of the node (the LP of a MILP).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from haap_milp.solvers.common.model import LinModel

try:
    import highspy
except ImportError:  # pragma: no cover - highspy is a runtime dependency
    highspy = None


def _silence_banner() -> None:
    """HiGHS prints a copyright banner on stdout when the first instance of a process is created
    (measured with highspy 1.16); create that instance with file descriptor 1 muted so that JSON
    written to stdout stays clean."""
    if highspy is None:
        return
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # pragma: no cover - no real file descriptor 1
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


_silence_banner()


def objective_terms(lm: LinModel) -> dict:
    """Objective coefficients in seconds: sum_j t_j + sum_j c_j + (M - 1) tau + sigma (eq. T1)."""
    obj = dict(lm.obj_time)
    obj[lm.tau] = obj.get(lm.tau, 0.0) + (lm.t.M - 1)
    obj[lm.sigma] = obj.get(lm.sigma, 0.0) + 1.0
    return obj


def lp_bound(lm: LinModel, cutoff_s: float | None = None, time_limit_s: float = 5.0) -> float | None:
    """LP value (seconds, constant included), +inf when the LP is infeasible, None when HiGHS
    gives no answer in time."""
    if highspy is None:
        return None
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    n = len(lm.names)
    inf = highspy.kHighsInf
    cost = np.zeros(n)
    for i, c in objective_terms(lm).items():
        cost[i] = c
    lb = np.array(lm.lb, float)
    ub = np.array([u if math.isfinite(u) else inf for u in lm.ub], float)
    h.addVars(n, lb, ub)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    lo, up, starts, idx, val = [], [], [], [], []
    for row in lm.rows:
        starts.append(len(idx))
        idx.extend(row.idx)
        val.extend(row.coef)
        lo.append(row.lb - row.const if math.isfinite(row.lb) else -inf)
        up.append(row.ub - row.const if math.isfinite(row.ub) else inf)
    if cutoff_s is not None:  # eq. X2
        starts.append(len(idx))
        obj = objective_terms(lm)
        idx.extend(obj)
        val.extend(obj.values())
        lo.append(-inf)
        up.append(cutoff_s - lm.obj_const + 1e-9 * max(1.0, cutoff_s))
    h.addRows(len(lo), np.array(lo), np.array(up), len(idx), np.array(starts, np.int32),
              np.array(idx, np.int32), np.array(val, float))
    highspy.Highs.resetGlobalScheduler(True)  # see milp.py: a pool sized by another run fails at once
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return math.inf
    if status != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value) + lm.obj_const
