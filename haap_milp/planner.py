"""The one composer: specs -> estimator -> presolve -> DP warm start -> exact solver -> plan.

Every returned plan is decoded, re-scored by the estimator (its iteration time must equal the
solver's objective), and checked independently before it is shown.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from haap_milp import presolve
from haap_milp.estimator import Estimator
from haap_milp.problem import Problem, RawResult
from haap_milp.solvers import get_solver
from haap_milp.specs import ClusterSpec, ModelSpec, SolveOptions, SolveResult, Status, TrainingSpec, relative_gap

log = logging.getLogger(__name__)

EXACT = ("cpsat", "milp")


@dataclass
class Outcome:
    """A solve with everything the report needs."""

    result: SolveResult
    presolved: presolve.Presolved | None = None
    estimate: object | None = None  # estimator.PlanEstimate of the plan
    violations: list = field(default_factory=list)  # checker findings (empty: plan is valid)
    estimator: Estimator | None = None
    raw_assignment: object | None = None  # problem.Assignment behind the plan


@dataclass
class Context:
    """Inputs and the shared estimator/presolve of one planning problem (built once, solved many times)."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    options: SolveOptions
    estimator: Estimator
    presolved: presolve.Presolved

    @classmethod
    def build(cls, model, cluster, training, options, estimator: Estimator | None = None) -> Context:
        est = estimator or Estimator(model, cluster, training)
        return cls(model, cluster, training, options, est, presolve.build(model, cluster, training, options, est))


def _restrict(problem: Problem, keep: list[int]) -> Problem:
    """The problem with only the listed micro-batch variants (sound pruning by eq. B1)."""
    return replace(problem, variants=tuple(problem.variants[i] for i in keep))


def run_method(ctx: Context, method: str, hint_raw: RawResult | None = None) -> tuple[RawResult, list[int]]:
    """Run one method on the presolved problem; returns the raw result and the variant map used."""
    prob = ctx.presolved.problem
    keep = list(range(len(prob.variants)))
    if method in EXACT and hint_raw is not None and hint_raw.objective_s is not None:
        # variants whose lower bound already exceeds the DP plan cannot hold the optimum
        keep = [i for i in keep if ctx.presolved.lower_bounds_s[i] < hint_raw.objective_s * (1 + 1e-9)]
        if hint_raw.assignment is not None and hint_raw.assignment.variant not in keep:
            keep.append(hint_raw.assignment.variant)
        keep.sort()
    sub = _restrict(prob, keep)
    hint = None
    if hint_raw is not None and hint_raw.assignment is not None and ctx.options.warm_start:
        hint = replace(hint_raw.assignment, variant=keep.index(hint_raw.assignment.variant))
    raw = get_solver(method)(sub, ctx.options, hint=hint) if method in EXACT else get_solver(method)(sub, ctx.options)
    if raw.assignment is not None:
        raw = replace(raw, assignment=replace(raw.assignment, variant=keep[raw.assignment.variant]))
    raw.stats.setdefault("variants_searched", len(keep))
    return raw, keep


def finish(ctx: Context, raw: RawResult, extra_wall_s: float = 0.0) -> Outcome:
    """Decode, re-score and check a raw solver result."""
    from haap_milp.check import check_plan  # late import: the checker is independent of the planner

    pre = ctx.presolved
    stats = {**pre.stats, **{k: v for k, v in raw.stats.items() if isinstance(v, (int, float, str))}}
    plan = est = None
    viol: list = []
    status, message = Status(raw.status), raw.message
    objective, bound = raw.objective_s, raw.bound_s
    if raw.assignment is not None:
        plan = presolve.decode(pre, raw.assignment, ctx.model, ctx.cluster, ctx.training)
        est = ctx.estimator.estimate(plan)
        plan = plan.model_copy(update={"stages": tuple(
            s.model_copy(update={"time_s": e.time_s, "memory_gib": e.memory_gib}) for s, e in zip(plan.stages, est.stages)
        )})
        stats["estimator_objective_rel_diff"] = abs(est.iteration_time_s - objective) / objective
        viol = check_plan(plan, ctx.model, ctx.cluster, ctx.training, target=ctx.options.target, estimator=ctx.estimator)
        if viol:
            message = (message + " " if message else "") + f"checker found {len(viol)} violation(s)"
            status = Status.ERROR
    if status == Status.INFEASIBLE:  # one sentence on the binding limit; the solver's detail stays in stats
        if message:
            stats["solver_message"] = message
        message = explain_infeasible(ctx)
    result = SolveResult(
        status=status, solver=raw.solver, objective_s=objective, bound_s=bound,
        gap=relative_gap(objective, bound), wall_time_s=raw.wall_time_s + extra_wall_s,
        plan=plan, message=message, stats=stats,
    )
    return Outcome(result, pre, est, viol, ctx.estimator, raw.assignment)


def solve(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions) -> Outcome:
    """Plan: DP heuristic and uniform baseline first (the better is the warm start), then the exact solver."""
    t0 = time.perf_counter()
    ctx = Context.build(model, cluster, training, options)
    if not ctx.presolved.problem.variants:
        raw = RawResult("INFEASIBLE", options.solver, message=explain_infeasible(ctx))
        return finish(ctx, raw, time.perf_counter() - t0)
    method = "cpsat" if options.solver == "auto" else options.solver
    dp_raw, _ = run_method(ctx, "dp")
    if method in ("dp", "uniform", "brute"):
        raw = dp_raw if method == "dp" else run_method(ctx, method)[0]
    else:
        uni_raw, _ = run_method(ctx, "uniform")
        raw, _ = run_method(ctx, method, hint_raw=best_heuristic(dp_raw, uni_raw))
        raw.stats["dp_objective_s"] = dp_raw.objective_s if dp_raw.objective_s is not None else "none"
        raw.stats["uniform_objective_s"] = uni_raw.objective_s if uni_raw.objective_s is not None else "none"
    presolve_s = ctx.presolved.stats.get("presolve_s", 0.0)
    out = finish(ctx, raw, extra_wall_s=0.0)
    total = time.perf_counter() - t0
    out.result = out.result.model_copy(update={"stats": {**out.result.stats, "total_wall_s": round(total, 4),
                                                          "presolve_s": presolve_s}})
    return out


def compare(model, cluster, training, options, methods=("cpsat", "milp", "dp", "uniform")) -> dict[str, Outcome]:
    """Every method on the same presolved problem; exact ones warm-started from the best heuristic."""
    ctx = Context.build(model, cluster, training, options)
    if not ctx.presolved.problem.variants:
        raw = RawResult("INFEASIBLE", "presolve", message=explain_infeasible(ctx))
        return {m: finish(ctx, replace(raw, solver=m)) for m in methods}
    heur = {m: run_method(ctx, m)[0] for m in ("dp", "uniform")}
    hint = best_heuristic(heur["dp"], heur["uniform"])
    out = {}
    for m in methods:
        raw = heur[m] if m in heur else run_method(ctx, m, hint_raw=hint if m in EXACT else None)[0]
        out[m] = finish(ctx, raw)
    return out


def best_heuristic(*raws: RawResult) -> RawResult:
    """The warm start: the better of the DP heuristic and the uniform baseline (so an exact plan is
    never worse than either, up to the requested gap)."""
    found = [r for r in raws if r.objective_s is not None and r.assignment is not None]
    return min(found, key=lambda r: r.objective_s) if found else raws[0]


def explain_infeasible(ctx: Context) -> str:
    """The binding limit, in one sentence, and the smallest cheap change that could help."""
    from haap_milp.explain import infeasibility_reason

    return infeasibility_reason(ctx)
