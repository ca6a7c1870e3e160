"""LP relaxation of a node model (eq. N2), solved with HiGHS' simplex through highspy.

The driver uses it to prune (variant, tau interval) nodes cheaply before an exact engine is
run on them; its value is a valid lower bound on every plan of the node (the LP of a MILP).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
from dataclasses import dataclass

import numpy as np

from haap_milp.deadline import current
from haap_milp.pipeline import TIME_RTOL
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


def highs_model(lm: LinModel, integer: bool, cutoff_s: float | None = None, cutoff_tol_s: float = 0.0,
                order: np.ndarray | None = None):
    """A ``highspy.Highs`` holding ``lm``: its columns (integrality only when ``integer``), its rows
    (``tdef`` constants moved to the bounds) and its objective (eq. T1, constant left out: add
    ``lm.obj_const`` to HiGHS' values). Each expression of ``lm.exprs`` is one more free column e_j after the
    model's own, with the row e_j - terms_j = 0, and the rows name it instead of repeating its terms (eq. N2c).
    ``cutoff_s``: one more row, objective <= cutoff_s + cutoff_tol_s (eq. X2). ``order``: column c holds variable
    ``order[c]`` (default: the LinModel's order); map values with ``columns(order)``. Output off; the caller sets the
    run's options."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    n, ne = len(lm.names), len(lm.exprs)
    order = np.arange(n) if order is None else np.asarray(order)
    col = np.r_[columns(order), np.arange(n, n + ne)]  # variable or n + expression id -> column
    inf = highspy.kHighsInf
    obj, const = lm.objective()
    cost = np.zeros(n + ne)
    for i, c in obj.items():
        cost[col[i]] = c
    lb = np.r_[np.array(lm.lb, float)[order], np.full(ne, -inf)]
    ub = np.r_[np.array([u if math.isfinite(u) else inf for u in lm.ub], float)[order], np.full(ne, inf)]
    h.addVars(n + ne, lb, ub)
    h.changeColsCost(n + ne, np.arange(n + ne, dtype=np.int32), cost)
    if integer:
        cols = col[np.flatnonzero(lm.integer)].astype(np.int32)
        h.changeColsIntegrality(len(cols), cols, np.full(len(cols), highspy.HighsVarType.kInteger))
    # the rows (tdef rows: sum a x + a0 - T <= 0), each expression named by its column (``LinModel.dense(apart)``:
    # ``Row.sparse``'s terms, in arrays: per row in Python this took ~10 ms a MoE node model), then eq. N2c's
    # e - terms = 0 per expression
    rid, var, val_ = lm.dense(lm.rows, apart=True)
    R = len(lm.rows)
    lo = [row.lb - row.const if math.isfinite(row.lb) else -inf for row in lm.rows]
    up = [row.ub - row.const if math.isfinite(row.ub) else inf for row in lm.rows]
    starts = np.searchsorted(rid, np.arange(R)).tolist()
    idx, val = var.tolist(), val_.tolist()
    for e, terms in enumerate(lm.exprs):
        starts.append(len(idx))
        nz = {v: c for v, c in terms.items() if c != 0}
        idx.extend(nz)
        val.extend(-c for c in nz.values())
        idx.append(n + e)
        val.append(1.0)
        lo.append(0.0)
        up.append(0.0)
    if cutoff_s is not None:  # eq. X2
        starts.append(len(idx))
        idx.extend(obj)
        val.extend(obj.values())
        lo.append(-inf)
        up.append(cutoff_s - const + cutoff_tol_s)
    h.addRows(len(lo), np.array(lo), np.array(up), len(idx), np.array(starts, np.int32),
              col[np.array(idx, np.int64)].astype(np.int32), np.array(val, float))
    return h


def columns(order: np.ndarray) -> np.ndarray:
    """Variable -> column of ``highs_model(..., order=order)``."""
    col = np.empty(len(order), np.int64)
    col[order] = np.arange(len(order))
    return col


# eq. N24: node LPs of fewer columns than this run without HiGHS' presolve. Measured (each LP of a search solved afresh
# both ways, the same optimum within 1e-13): four of Sailor's OPT-350M rows, 76-2000 columns, 1.25 -> 0.70 s over
# 312 LPs; from 1000 columns mixed (llama3-70b x 4 types, 27 LPs of 1000-2000: 518 ms with it, 622 ms without)
PRESOLVE_MIN_COLS = 1000
UNSCALED = True
RC_MIN = 1e-6  # eq. N19: a smaller reduced cost of tau gives no useful cap
DUAL_TOL = 1e-7  # HiGHS' default dual_feasibility_tolerance (eq. N19's slack)
_pools = threading.local()  # .threads: the "threads" option this thread's pool was last made for (unset: never)


def run(h, race=None) -> None:
    """``h.run()`` on a thread pool made for its thread count: HiGHS keeps one pool per calling thread
    (HighsTaskExecutor's thread-local handle), sized by that thread's first run, and a later run on the thread that
    asked for another thread count (the LP bounds here, the MILP's node runs with ``--threads``) returned model
    status "Not Set" at once, every time (measured: bench rows, highspy 1.16). The pool is made afresh only when
    the count differs from the thread's last one: a reset before every run cost 3.3 of 8.4 ms CPU per node LP
    (Sailor's 80+240 row, 400 LPs a solve under eq. N2b). ``race`` (eq. N21): its end stops the run too."""
    threads = _option(h, "threads")
    if getattr(_pools, "threads", None) != threads:
        highspy.Highs.resetGlobalScheduler(True)
        _pools.threads = threads
    dl = current()
    if not dl.handles_sigint and race is None:
        h.run()
        return
    h.HandleUserInterrupt = True  # cancelSolve (deadline.interrupt on Ctrl-C, the race's end) then stops the run
    with dl.stopper(h.cancelSolve), (race.stopper(h.cancelSolve) if race is not None else contextlib.nullcontext()):
        h.run()


def _option(h, name: str):
    """An option's value (highspy returns (status, value))."""
    got = h.getOptionValue(name)
    return got[1] if isinstance(got, tuple) else got


@dataclass(frozen=True)
class LPRelaxation:
    """The node LP's value (seconds, constant included; +inf: infeasible) and, when solved, tau's value and reduced
    cost there (eq. N19) and the optimum ``x`` (the model's variables in its column order; eq. N2d)."""

    value: float
    tau: float = math.nan
    tau_rc: float = 0.0
    x: np.ndarray | None = None


def lp_relaxation(lm: LinModel, cutoff_s: float | None = None, time_limit_s: float = 5.0) -> LPRelaxation | None:
    """The LP of ``lm`` (eq. N2); None when HiGHS gives no answer in time."""
    if highspy is None:
        return None
    tol = None if cutoff_s is None else TIME_RTOL * max(1.0, cutoff_s)
    h = highs_model(lm, integer=False, cutoff_s=cutoff_s, cutoff_tol_s=tol or 0.0)
    _lp_options(h, time_limit_s)
    run(h)
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return LPRelaxation(math.inf)
    if status != highspy.HighsModelStatus.kOptimal:
        return None
    sol = h.getSolution()
    value = float(h.getInfo().objective_function_value) + lm.obj_const
    x = np.asarray(sol.col_value[: len(lm.names)], float) if sol.value_valid else None
    if not sol.dual_valid:
        return LPRelaxation(value, x=x)
    return LPRelaxation(value, float(sol.col_value[lm.tau]), float(sol.col_dual[lm.tau]), x)


def _lp_options(h, time_limit_s: float) -> None:
    """A node LP's run options: its time limit, and (eq. N24) no presolve below PRESOLVE_MIN_COLS columns, no
    scaling from there on (UNSCALED)."""
    h.setOptionValue("time_limit", float(time_limit_s))
    if h.getNumCol() < PRESOLVE_MIN_COLS:
        h.setOptionValue("presolve", "off")
    elif UNSCALED:
        h.setOptionValue("simplex_scale_strategy", 0)


def lp_bound(lm: LinModel, cutoff_s: float | None = None, time_limit_s: float = 5.0) -> float | None:
    """LP value (seconds, constant included), +inf when the LP is infeasible, None when HiGHS
    gives no answer in time."""
    lp = lp_relaxation(lm, cutoff_s, time_limit_s)
    return None if lp is None else lp.value


def sigma_cap(lm: LinModel, cutoff_s: float, time_limit_s: float = 5.0) -> float | None:
    """Eq. N22: every plan of the node with T <= cutoff has sigma <= cutoff - min (T - sigma), and the LP of T - sigma
    (the node's LP with sigma's cost 0 and the cut-off row of eq. X2) bounds that minimum from below. HiGHS' tolerances
    widen the cap as in ``tau_cap`` (the objective at a point within dual_feasibility_tolerance of optimal is within
    DUAL_TOL per unit of each range of the true minimum). -inf: the LP is infeasible (no plan below the cut-off);
    None: no answer in time."""
    if highspy is None:
        return None
    unit = max(1.0, abs(cutoff_s))
    h = highs_model(lm, integer=False, cutoff_s=cutoff_s, cutoff_tol_s=TIME_RTOL * unit)
    h.changeColCost(lm.sigma, 0.0)  # (the default column order: column i is variable i)
    _lp_options(h, time_limit_s)
    run(h)
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return -math.inf
    if status != highspy.HighsModelStatus.kOptimal:
        return None
    rest = float(h.getInfo().objective_function_value) + lm.obj_const
    return cutoff_s - rest + _slack(lm, unit)


def _slack(lm: LinModel, unit: float) -> float:
    """HiGHS' dual tolerance over the node's ranges (a range of ``unit`` where unbounded) and rows, each expression of
    eq. N2c one free column and one row more, plus TIME_RTOL of ``unit`` (eqs. N19, N22)."""
    lb, ub = np.asarray(lm.lb, float), np.asarray(lm.ub, float)
    ranges = float(np.where(np.isfinite(ub), ub - lb, unit).sum())
    extra = 2 * len(lm.exprs)
    return DUAL_TOL * (ranges + (len(lm.rows) + extra) * unit) + TIME_RTOL * unit


def tau_cap(lp: LPRelaxation, lm: LinModel, cutoff_s: float) -> float:
    """Eq. N19, reduced-cost fixing on tau: every point of the node's LP has objective >= value + rc * (tau - tau*)
    (at an optimal basis the other reduced-cost terms and the row-dual terms are >= 0), so no plan with T < cutoff
    has tau above tau* + (cutoff - value) / rc. HiGHS' dual feasibility tolerance (1e-7 per unit of each variable's
    range, each row's dual alike, a range of max(1, cutoff) where unbounded) widens the cut-off so that it never
    cuts a plan. +inf: no cap."""
    if not math.isfinite(lp.value) or not lp.tau_rc > RC_MIN or not math.isfinite(lp.tau):
        return math.inf
    return lp.tau + (cutoff_s - lp.value + _slack(lm, max(1.0, abs(cutoff_s)))) / lp.tau_rc

