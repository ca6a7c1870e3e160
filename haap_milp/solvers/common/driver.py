"""One exact model per micro-batch variant, best bound first, sharing the incumbent.

Variants are few (2-4) and each one's M fixes the (M - 1) * tau product, so every model is
linear (formulations/README.md, "Variants"). The driver orders variants by their eq. B2
bound, skips those that cannot beat the incumbent by more than the requested gap, derives
the time cut-off of eq. X1 from the incumbent, splits the time limit, and combines the
per-variant bounds into one proven lower bound.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from haap_milp.problem import Assignment, Problem, RawResult, evaluate, violations
from haap_milp.solvers.common.bounds import VariantBound, infeasibility_reason, variant_bound
from haap_milp.solvers.common.hints import canonical
from haap_milp.solvers.common.tables import Tables, build_tables

log = logging.getLogger(__name__)
MIN_SHARE_S = 0.05  # a variant with less time than this is not started (its B2 bound stands)


@dataclass
class VariantResult:
    """What a solver's per-variant model returns. ``bound_s`` bounds every plan of the variant
    with T <= cutoff (None: nothing proven beyond eq. B2)."""

    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | NO_SOLUTION | ERROR
    assignment: Assignment | None = None
    bound_s: float | None = None
    stats: dict = field(default_factory=dict)
    message: str = ""


SolveVariant = Callable[[Problem, Tables, VariantBound, "float | None", float, "Assignment | None", object],
                        VariantResult]


@dataclass
class _State:
    inc: Assignment | None = None
    inc_obj: float = math.inf
    bounds: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    tol_s: float = 0.0

    def offer(self, problem: Problem, a: Assignment | None, who: str) -> None:
        if a is None:
            return
        bad = violations(problem, a)
        if bad:
            self.errors.append(f"{who}: decoded plan violates {bad[0]}")
            log.error("%s returned an infeasible plan: %s", who, bad)
            return
        obj = evaluate(problem, a)
        if obj < self.inc_obj:
            self.inc, self.inc_obj = a, obj


def _start(problem: Problem, hint: Assignment | None, name: str) -> tuple[_State, list, list]:
    st = _State()
    tables = [build_tables(problem, v) for v in range(len(problem.variants))]
    vb = [variant_bound(problem, t) for t in tables]
    if hint is not None and 0 <= hint.variant < len(problem.variants) and not violations(problem, hint):
        st.offer(problem, canonical(problem, tables[hint.variant], hint), f"{name} hint")
        st.stats["hint_objective_s"] = st.inc_obj
    elif hint is not None:
        log.warning("%s: ignoring an infeasible hint", name)
    return st, tables, vb


def run_variants(problem: Problem, options, hint: Assignment | None, name: str, solve_variant: SolveVariant) -> RawResult:
    """Drive ``solve_variant`` over the variants; see the module docstring."""
    t0 = time.perf_counter()
    deadline = t0 + options.time_limit_s
    r = options.relative_gap
    st, tables, vb = _start(problem, hint, name)
    order = sorted(range(len(problem.variants)), key=lambda v: (vb[v].total_s, v))
    for pos, v in enumerate(order):
        b = vb[v]
        if not math.isfinite(b.total_s):
            st.bounds[v] = math.inf
            continue
        cutoff = None
        if st.inc is not None:
            cutoff = st.inc_obj if st.inc.variant == v else st.inc_obj * (1 - r)
            if b.total_s >= cutoff:
                st.bounds[v] = b.total_s  # eq. B2 already proves it cannot do better
                st.stats[f"v{v}"] = "pruned_by_bound"
                continue
        share = (deadline - time.perf_counter()) / (len(order) - pos)
        if share < MIN_SHARE_S and (st.inc is not None or pos > 0):
            st.bounds[v] = b.total_s
            st.stats[f"v{v}"] = "not_started_time_limit"
            continue
        _one(problem, options, st, tables, vb, v, cutoff, max(share, MIN_SHARE_S), name, solve_variant)
    return _finish(problem, options, st, vb, name, time.perf_counter() - t0)


def _one(problem, options, st: _State, tables, vb, v: int, cutoff, share: float, name: str,
         solve_variant: SolveVariant) -> None:
    b = vb[v]
    var = problem.variants[v]
    tau_ub = None
    if cutoff is not None and var.num_microbatches > 1:
        tau_ub = (cutoff - b.rest_lb) / (var.num_microbatches - 1)  # eq. X1
    t = build_tables(problem, v, tau_ub) if tau_ub is not None else tables[v]
    if t.p_min == 0:  # nothing fits under the cut-off
        st.bounds[v] = cutoff if cutoff is not None else math.inf
        st.stats[f"v{v}"] = "empty_under_cutoff"
        return
    vhint = st.inc if st.inc is not None and st.inc.variant == v else None
    t1 = time.perf_counter()
    try:
        res = solve_variant(problem, t, b, cutoff, share, vhint, options)
    except Exception as exc:  # a solver failure is a result, not a crash
        log.exception("%s failed on variant %d", name, v)
        res = VariantResult("ERROR", message=f"{type(exc).__name__}: {exc}")
    st.stats[f"v{v}"] = f"{res.status} in {time.perf_counter() - t1:.3f}s"
    for key, val in res.stats.items():
        if isinstance(val, (int, float, str)):
            st.stats[f"v{v}_{key}"] = val
    st.tol_s = max(st.tol_s, float(res.stats.get("tolerance_s", 0.0)))
    if res.status == "ERROR":
        st.errors.append(res.message)
    st.offer(problem, res.assignment, name)
    if res.status == "INFEASIBLE":
        bound = cutoff if cutoff is not None else math.inf
    else:
        bound = max(res.bound_s if res.bound_s is not None else -math.inf, b.total_s)
        if cutoff is not None:
            bound = min(bound, cutoff)
    st.bounds[v] = bound


def _finish(problem, options, st: _State, vb, name: str, wall_s: float) -> RawResult:
    bound = min(st.bounds.values(), default=math.inf)
    st.stats["tolerance_s"] = st.tol_s
    msg = "; ".join(st.errors)
    if st.inc is None:
        if math.isinf(bound) and not st.errors:
            return RawResult("INFEASIBLE", name, bound_s=None, wall_time_s=wall_s,
                             message=infeasibility_reason(problem, vb), stats=st.stats)
        status = "ERROR" if st.errors else "NO_SOLUTION"
        return RawResult(status, name, bound_s=bound if math.isfinite(bound) else None, wall_time_s=wall_s,
                         message=msg or "time limit reached before any plan was found", stats=st.stats)
    bound = min(bound, st.inc_obj)
    gap_abs = st.inc_obj - bound
    proven = gap_abs <= options.relative_gap * st.inc_obj + st.tol_s + 1e-9 * st.inc_obj
    status = "OPTIMAL" if proven else "FEASIBLE"
    if not proven and not msg:
        msg = f"gap {gap_abs / st.inc_obj:.2%} when the time limit was reached"
    return RawResult(status, name, assignment=st.inc, objective_s=st.inc_obj, bound_s=bound, wall_time_s=wall_s,
                     message=msg, stats=st.stats)
