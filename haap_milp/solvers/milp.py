"""MILP on the slot formulation with HiGHS through highspy (CBC through PuLP as fallback);
formulations/milp.md.

One model per micro-batch variant (common.branch_and_bound); times stay in seconds (floats). The rows,
columns and objective come from the LinModel (``common.lp.highs_model``, shared with the node
LP bounds), the warm start from ``LinModel.complete`` (``Highs.setSolution``), the dual bound
from ``Highs.getInfo().mip_dual_bound``. CBC (PuLP) runs a node instead when highspy is missing
or HiGHS fails on it, or for every node with ``backend="cbc"``.
"""

from __future__ import annotations

import functools
import logging
import math
import time

from haap_milp.problem import Assignment, Problem, RawResult
from haap_milp.solvers.common import (
    LinModel,
    VariantBound,
    VariantResult,
    decode,
    run_variants,  # importing common mutes the HiGHS banner (common/lp.py)
)
from haap_milp.solvers.common.highs_node import ABS_GAP_S
from haap_milp.solvers.common.highs_node import highs_node as _highs_node
from haap_milp.solvers.common.lp import highspy
from haap_milp.solvers.common.model import start_values
from haap_milp.specs import SolveOptions

log = logging.getLogger(__name__)
# CBC gives no dual bound through PuLP: an optimal CBC node is bounded by its objective less the
# requested gap and ABS_GAP_S, and that objective can sit below evaluate() of the plan by CBC's
# feasibility tolerances (measured: 7e-9 s), so a CBC optimum is proven to within twice ABS_GAP_S
CBC_TOL_S = 2 * ABS_GAP_S
BACKENDS = ("highs", "cbc")


def solve(problem: Problem, options: SolveOptions | None = None, hint: Assignment | None = None,
          backend: str = "highs") -> RawResult:
    """Exact solve with HiGHS (``backend="cbc"``: CBC through PuLP; also the fallback when highspy
    is missing or HiGHS fails on a node)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown MILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    node = functools.partial(_solve_node, backend=backend)
    return run_variants(problem, options or SolveOptions(), hint, "milp", node)


def _solve_node(problem: Problem, lm: LinModel, b: VariantBound, cutoff: float | None, time_s: float,
                hint: Assignment | None, options: SolveOptions, primal: bool = False,
                backend: str = "highs") -> VariantResult:
    """One (variant, tau interval) node model (``primal`` changes nothing here)."""
    t0 = time.perf_counter()
    if backend == "highs" and highspy is not None:
        try:
            res = _highs_node(problem, lm, cutoff, time_s, hint, options, t0)
        except Exception as exc:  # noqa: BLE001 - any HiGHS failure: CBC gets the node
            res = VariantResult("ERROR", message=f"HiGHS: {type(exc).__name__}: {exc}")
        if res.status != "ERROR":
            return res
        log.warning("%s; CBC solves this node instead", res.message)
        fallback = {"fallback": f"cbc ({res.message})"}
    elif backend == "highs":
        log.warning("highspy unavailable; MILP falls back to CBC")
        fallback = {"fallback": "cbc (highspy unavailable)"}
    else:
        fallback = {}
    res = _cbc_node(lm, cutoff, time_s - (time.perf_counter() - t0), hint, options)
    res.stats.update(fallback)
    return res


def _cbc_node(lm: LinModel, cutoff: float | None, time_s: float, hint: Assignment | None,
              options: SolveOptions) -> VariantResult:
    """The node on CBC through PuLP (the fallback; the same rows as ``common.lp.highs_model``)."""
    import pulp  # only the fallback needs PuLP

    t0 = time.perf_counter()
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
    terms, const = lm.objective()
    obj = pulp.LpAffineExpression([(x[i], c) for i, c in terms.items()])
    prob += obj  # the constant is added back when reading values
    if cutoff is not None:  # eq. X2: only plans at least as good as the incumbent
        prob += pulp.LpConstraint(obj, pulp.LpConstraintLE, "cutoff", cutoff - const + ABS_GAP_S)
    vals = start_values(lm, hint) if hint is not None else None
    for i, val in (vals or {}).items():
        x[i].setInitialValue(val)
    build_s = time.perf_counter() - t0
    solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(time_s - build_s, 0.01), threads=options.threads,
                               gapRel=options.relative_gap, gapAbs=ABS_GAP_S, warmStart=vals is not None)
    prob.solve(solver)
    st = pulp.LpStatus[prob.status]
    stats = {"build_s": round(build_s, 4), "vars": len(lm.names), "rows": len(lm.rows), "hinted": int(vals is not None),
             "tolerance_s": CBC_TOL_S, "backend": "cbc", "gap_rel": options.relative_gap, "cbc_status": st}
    if st == "Infeasible":
        return VariantResult("INFEASIBLE", stats=stats)
    if prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        a = decode(lm, [v.varValue for v in x])
        opt = prob.sol_status == pulp.LpSolutionOptimal
        val = pulp.value(prob.objective) + const
        bound = val * (1 - options.relative_gap) - ABS_GAP_S if opt else None  # CBC stops within gapRel
        return VariantResult("OPTIMAL" if opt else "FEASIBLE", a, bound, stats)
    return VariantResult("NO_SOLUTION", stats=stats)
