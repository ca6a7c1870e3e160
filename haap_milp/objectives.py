"""`solve --objective time|cost|energy` with its bounds, and `--robust PCT`: which planning run answers which.

- time, no bound: ``planner.orchestrate`` as before;
- time under ``--max-cost-per-hour``: one step of the sweep (eq. W1 with the cap);
- cost / energy: the band search (``frontier.band_search``, eqs. EB1-EB4), proven within the gap; with
  ``--max-iteration-time`` / ``--min-tokens-per-s`` T <= T_max is a row of every band's solve (eqs. TX1e-TX3e);
- ``--max-iteration-time`` / ``--min-tokens-per-s``: a bound on T; a plan past it is not returned;
- ``--robust PCT``: the time optimum of the worst-case Problem (``robust``, eq. R3).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from haap_milp import frontier, robust
from haap_milp.catalog.prices import PriceBook
from haap_milp.deadline import Deadline
from haap_milp.errors import HaapInputError
from haap_milp.planner import Context, Outcome, orchestrate
from haap_milp.problem import evaluate
from haap_milp.specs import SolveResult, Status

OBJECTIVES = ("time", "cost", "energy")


@dataclass(frozen=True)
class Goal:
    objective: str = "time"
    max_usd_per_hour: float | None = None
    max_iteration_time_s: float | None = None  # the tighter of --max-iteration-time and --min-tokens-per-s
    robust_pct: float | None = None  # 0.1 = 10 %
    max_points: int = 8
    step: float = 0.05  # delta of eq. F1

    @property
    def plain(self) -> bool:
        return (self.objective == "time" and self.max_usd_per_hour is None and self.max_iteration_time_s is None
                and self.robust_pct is None)


@dataclass
class Answer:
    outcome: Outcome
    doc: dict = field(default_factory=dict)  # the "objective" block of the JSON and the report


def validate(goal: Goal) -> None:
    if goal.objective not in OBJECTIVES:
        raise HaapInputError(f"--objective {goal.objective!r}: choose one of {', '.join(OBJECTIVES)}",
                             field="--objective", value=goal.objective)
    if goal.objective == "energy" and goal.max_usd_per_hour is not None:
        raise HaapInputError("--max-cost-per-hour with --objective energy: one budget row at a time (eq. W1); "
                             "use --objective cost or time with the cap", field="--max-cost-per-hour")
    if goal.robust_pct is not None and goal.objective != "time":
        raise HaapInputError(f"--robust with --objective {goal.objective}: the robust plan minimises the worst-case "
                             "iteration time; use --objective time", field="--robust", value=goal.robust_pct)
    if goal.robust_pct is not None and not 0 <= goal.robust_pct <= 10:  # (the flag: 0 to 1000 %, both ends)
        raise HaapInputError(f"--robust {goal.robust_pct * 100:g}: give a percentage from 0 to 1000",
                             field="--robust", value=goal.robust_pct)


def _refuse(out: Outcome, message: str, proven: bool = True) -> Outcome:
    """No plan answers the goal: INFEASIBLE when that is proven, else NO_SOLUTION (time ran out first)."""
    r = out.result
    out.result = SolveResult(status=Status.INFEASIBLE if proven else Status.NO_SOLUTION, solver=r.solver, objective_s=None, bound_s=r.bound_s, gap=None,
                             wall_time_s=r.wall_time_s, plan=None, message=message, stats=r.stats)
    out.estimate, out.raw_assignment = None, None
    return out


def plan_for(ctx: Context, book: PriceBook, goal: Goal, deadline: Deadline | None = None) -> Answer:
    """The outcome that answers ``goal`` and its ``objective`` block (see the module docstring)."""
    validate(goal)
    if goal.robust_pct is not None:
        return _robust(ctx, goal, deadline)
    if goal.objective == "time" and goal.max_usd_per_hour is None:
        out = orchestrate(ctx, [(ctx.options.solver, None)], deadline=deadline).outcomes[0]
        t_max = goal.max_iteration_time_s
        if out.estimate is not None and t_max is not None and out.estimate.iteration_time_s > t_max:
            b = out.result.bound_s  # proven only when no plan can be faster than t_max
            out = _refuse(out, f"the fastest plan found takes {out.estimate.iteration_time_s:.4g} s per iteration, more "
                               f"than the {t_max:.4g} s bound (--max-iteration-time / --min-tokens-per-s); every plan "
                               f"takes at least {'-' if b is None else format(b, '.4g')} s",
                          proven=b is not None and b > t_max)
        return Answer(out, {"objective": "time"})
    measure = "cost" if goal.objective in ("time", "cost") else "energy"
    if goal.objective != "time":  # the exact band search (eqs. EB1-EB4; T_max: eqs. TX1e-TX3e)
        fr = frontier.band_search(ctx, book, measure, cap=goal.max_usd_per_hour,
                                  max_time_s=goal.max_iteration_time_s, deadline=deadline)
    else:  # time under a budget: one step of the sweep (eq. W1), which refuses a plan past the T bound (eq. F1)
        fr = frontier.sweep(ctx, book, measure, max_points=1, cap=goal.max_usd_per_hour,
                            max_time_s=goal.max_iteration_time_s, stop_when_bounded=True, step=goal.step,
                            deadline=deadline)
    doc = {"objective": goal.objective, "search": fr.search, "solves": fr.solves, "dp_runs": fr.dp_runs,
           "points_searched": len(fr.points), "frontier_complete": fr.complete,
           "stopped": fr.stopped, "max_usd_per_hour": goal.max_usd_per_hour,
           "max_iteration_time_s": goal.max_iteration_time_s}
    pick = fr.points[0] if goal.objective == "time" and fr.points else fr.best
    if pick is None:
        bounds = [w for w in (goal.max_usd_per_hour is not None and f"{goal.max_usd_per_hour:g} $/h",
                              goal.max_iteration_time_s is not None and f"{goal.max_iteration_time_s:.4g} s per "
                              "iteration") if w]
        why = "no plan within " + ", ".join(bounds) if bounds else "no plan found"
        empty = SolveResult(status=Status.INFEASIBLE, solver=ctx.options.solver, objective_s=None, bound_s=None,
                            gap=None, wall_time_s=0.0, plan=None, message="", stats=dict(ctx.presolved.stats))
        told = fr.complete and fr.stopped.startswith("proven: no plan within")  # eq. TX3e names the binding bound
        # no plan at any budget: the binding limit, as the time objective says it (planner.explain_infeasible)
        message = fr.infeasible or (fr.stopped if told else f"{why} ({fr.stopped})")
        return Answer(_refuse(Outcome(empty, ctx.presolved, estimator=ctx.estimator), message,
                              proven=fr.complete), doc)
    if goal.objective != "time":
        unit = "usd_per_iteration" if measure == "cost" else "joules_per_iteration"
        doc.update({unit: pick.value, f"{unit}_lower_bound": fr.lower_bound, "objective_gap": fr.gap})
    return Answer(pick.outcome, doc)


def _robust(ctx: Context, goal: Goal, deadline: Deadline | None) -> Answer:
    """Eq. R3: the plan with the least worst-case T, and the nominal plan's worst case beside it."""
    pct = goal.robust_pct
    prob = ctx.presolved.problem
    wc = robust.worst_case_problem(prob, pct)
    rctx = replace(ctx, presolved=replace(ctx.presolved, problem=wc))
    half = deadline.cap(deadline.remaining() / 2) if deadline is not None and deadline.limited else deadline
    out = orchestrate(rctx, [(ctx.options.solver, None)], deadline=half).outcomes[0]  # the nominal run gets the rest
    doc = {"objective": "time", "robust_pct": pct * 100}
    if out.raw_assignment is None:
        return Answer(out, doc)
    nominal = orchestrate(ctx, [(ctx.options.solver, None)], deadline=deadline).outcomes[0]
    doc["worst_case_iteration_time_s"] = evaluate(wc, out.raw_assignment)  # eq. R2 on the problem built above
    doc["worst_case_bound_s"] = out.result.bound_s
    if nominal.raw_assignment is not None:
        doc["nominal_plan_iteration_time_s"] = nominal.estimate.iteration_time_s
        doc["nominal_plan_worst_case_s"] = evaluate(wc, nominal.raw_assignment)
    # the outcome's objective is the worst case (what was minimised); the plan's own time stays nominal
    out.result = out.result.model_copy(update={"message": (out.result.message + " " if out.result.message else "")
                                               + f"robust to +/-{pct * 100:g} % compute error per GPU type (eq. R3)"})
    t_max = goal.max_iteration_time_s
    if t_max is not None and doc["worst_case_iteration_time_s"] > t_max:
        out = _refuse(out, f"the robust plan's worst case {doc['worst_case_iteration_time_s']:.4g} s exceeds the "
                           f"{t_max:.4g} s bound")
    return Answer(out, doc)
