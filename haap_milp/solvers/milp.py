"""MILP on the slot formulation through PuLP with HiGHS (CBC as fallback); formulations/milp.md.

One model per micro-batch variant (common.driver); times stay in seconds (floats). The
HiGHS interface of PuLP is extended with a warm start (``Highs.setSolution``) and reads the
MIP dual bound back (``Highs.getInfo().mip_dual_bound``).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pulp

from haap_milp.problem import Assignment, Problem, RawResult
from haap_milp.solvers.common import (
    LinModel,
    VariantBound,
    VariantResult,
    decode,
    hint_values,
    run_variants,  # importing common mutes the HiGHS banner (common/lp.py)
)
from haap_milp.specs import SolveOptions

log = logging.getLogger(__name__)
ABS_GAP_S = 1e-6  # HiGHS mip_abs_gap (its default): an optimum is proven to within this many seconds

try:  # PuLP's in-process HiGHS needs highspy
    import highspy
    _HAVE_HIGHS = pulp.HiGHS().available()
except (ImportError, AttributeError, RuntimeError):  # pragma: no cover - no usable highspy
    highspy = None
    _HAVE_HIGHS = False




if _HAVE_HIGHS:
    class _HiGHSWarm(pulp.HiGHS):
        """PuLP's HiGHS plus a MIP start and the dual bound."""

        def __init__(self, start: dict | None = None, **kw):
            super().__init__(**kw)
            self.start = start or {}

        def callSolver(self, lp):
            # HiGHS keeps one global thread pool sized by its first run; a later run that asks for
            # another thread count (the LP bounds of common/lp.py, or CP-SAT's node LPs, before it)
            # returned model status "Not Set" at once, every time (measured: bench rows, highspy 1.16)
            highspy.Highs.resetGlobalScheduler(True)
            if self.start:
                idx = np.array([v.index for v in self.start], dtype=np.int32)
                val = np.array(list(self.start.values()), dtype=np.float64)
                lp.solverModel.setSolution(len(idx), idx, val)
            lp.solverModel.run()


def solve(problem: Problem, options: SolveOptions | None = None, hint: Assignment | None = None) -> RawResult:
    """Exact solve with HiGHS through PuLP (CBC when highspy is missing)."""
    return run_variants(problem, options or SolveOptions(), hint, "milp", _solve_node)


def _build(lm: LinModel, cutoff: float | None) -> tuple[pulp.LpProblem, list]:
    prob = pulp.LpProblem("haap", pulp.LpMinimize)
    x = []
    for i, name in enumerate(lm.names):
        cat = pulp.LpInteger if lm.integer[i] else pulp.LpContinuous
        ub = None if lm.ub[i] == math.inf else lm.ub[i]
        x.append(prob.add_variable(f"v{i}_{name.replace('[', '_').replace(']', '').replace(',', '_')}",
                                   lm.lb[i], ub, cat))
    for r, row in enumerate(lm.rows):
        expr = pulp.LpAffineExpression([(x[i], c) for i, c in zip(row.idx, row.coef)])
        lo, hi = row.lb - row.const, row.ub - row.const  # tdef rows: sum a x + a0 - T <= 0
        if lo == hi:
            prob += pulp.LpConstraint(expr, pulp.LpConstraintEQ, f"r{r}", lo)
            continue
        if lo > -math.inf:
            prob += pulp.LpConstraint(expr, pulp.LpConstraintGE, f"r{r}l", lo)
        if hi < math.inf:
            prob += pulp.LpConstraint(expr, pulp.LpConstraintLE, f"r{r}u", hi)
    obj = pulp.LpAffineExpression([(x[i], c) for i, c in lm.obj_time.items()])
    obj += (lm.t.M - 1) * x[lm.tau] + x[lm.sigma]
    prob += obj  # the constant obj_const is added back when reading values
    if cutoff is not None:  # eq. X2: only plans at least as good as the incumbent
        prob += pulp.LpConstraint(obj, pulp.LpConstraintLE, "cutoff", cutoff - lm.obj_const + ABS_GAP_S)
    return prob, x


def _start(lm: LinModel, x: list, hint: Assignment | None) -> dict | None:
    vals = hint_values(lm, hint) if hint is not None else None
    if vals is None:
        return None
    for tv, kind in ((lm.tau, "T2"), (lm.sigma, "T3")):  # complete tau, sigma as maxima of their rows
        best = lm.lb[tv]
        for row in lm.rows:
            if row.kind == "tdef" and tv in row.idx and row.label.startswith(kind):
                q = -row.coef[row.idx.index(tv)]  # min(k, M) on the in-flight rows (eq. T2)
                best = max(best, (sum(c * vals[i] for i, c in zip(row.idx, row.coef) if i != tv) + row.const) / q)
        vals[tv] = best
    return {x[i]: v for i, v in vals.items()}


def _solver(options: SolveOptions, time_s: float, start: dict | None):
    if _HAVE_HIGHS:
        return _HiGHSWarm(start=start, msg=False, timeLimit=max(time_s, 0.01), threads=options.threads,
                          gapRel=options.relative_gap, random_seed=options.seed, mip_abs_gap=ABS_GAP_S)
    log.warning("highspy unavailable; MILP falls back to CBC")
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=max(time_s, 0.01), threads=options.threads,
                             gapRel=options.relative_gap, warmStart=start is not None)


def _solve_node(problem: Problem, lm: LinModel, b: VariantBound, cutoff: float | None, time_s: float,
                hint: Assignment | None, options: SolveOptions, primal: bool = False) -> VariantResult:
    """HiGHS on one (variant, tau interval) node model (``primal`` changes nothing here)."""
    t0 = time.perf_counter()
    prob, x = _build(lm, cutoff)
    start = _start(lm, x, hint)
    if start is not None and not _HAVE_HIGHS:
        for var, val in start.items():
            var.setInitialValue(val)
    build_s = time.perf_counter() - t0
    solver = _solver(options, time_s - build_s, start)
    prob.solve(solver)
    stats = {"build_s": round(build_s, 4), "vars": len(lm.names), "rows": len(lm.rows), "hinted": int(start is not None),
             "tolerance_s": ABS_GAP_S, "backend": "highs" if _HAVE_HIGHS else "cbc", "gap_rel": options.relative_gap}
    return _read(prob, lm, x, stats)


def _read(prob: pulp.LpProblem, lm: LinModel, x: list, stats: dict) -> VariantResult:
    if _HAVE_HIGHS:
        h = prob.solverModel
        ms = h.getModelStatus()
        info = h.getInfo()
        stats["highs_status"] = h.modelStatusToString(ms)
        stats["nodes"] = int(info.mip_node_count)
        has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
        bound = info.mip_dual_bound + lm.obj_const if math.isfinite(info.mip_dual_bound) else None
        if ms == highspy.HighsModelStatus.kInfeasible:
            return VariantResult("INFEASIBLE", stats=stats)
        if has_sol:
            a = decode(lm, [v.varValue for v in x])
            status = "OPTIMAL" if ms == highspy.HighsModelStatus.kOptimal else "FEASIBLE"
            return VariantResult(status, a, bound, stats)
        if ms in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kInterrupt):
            return VariantResult("NO_SOLUTION", bound_s=bound, stats=stats)
        return VariantResult("ERROR", stats=stats, message=f"HiGHS: {stats['highs_status']}")
    st = pulp.LpStatus[prob.status]
    stats["cbc_status"] = st
    if st == "Infeasible":
        return VariantResult("INFEASIBLE", stats=stats)
    if prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        a = decode(lm, [v.varValue for v in x])
        opt = prob.sol_status == pulp.LpSolutionOptimal
        val = pulp.value(prob.objective) + lm.obj_const
        bound = val * (1 - stats["gap_rel"]) - ABS_GAP_S if opt else None  # CBC stops within gapRel
        return VariantResult("OPTIMAL" if opt else "FEASIBLE", a, bound, stats)
    return VariantResult("NO_SOLUTION", stats=stats)
