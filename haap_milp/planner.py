"""The one composer: specs -> estimator -> presolve -> DP warm start -> exact solver -> plan.

``orchestrate`` is the one place the sequence is written (heuristics -> best heuristic -> methods
that take a hint -> finish); ``solve``, ``compare`` and the benchmark (``bench.run.run_task``) call
it. Which methods exist, and which are exact or heuristic, is ``haap_milp.methods``. Every returned
plan is decoded, re-scored by the estimator (its iteration time must equal the solver's objective),
and checked independently before it is shown.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from haap_milp import presolve, worker
from haap_milp.deadline import Deadline, current, use
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator, Profile
from haap_milp.methods import HEURISTICS, LISTED, METHODS, resolve
from haap_milp.pipeline import TIME_RTOL, within_gap
from haap_milp.problem import Problem, RawResult
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import late_hint
from haap_milp.specs import ClusterSpec, ModelSpec, SolveOptions, SolveResult, Status, TrainingSpec, relative_gap

log = logging.getLogger(__name__)
# Whole-command budget (issue 11). RESERVE_S: kept back from the exact search for decode, re-score, check,
# the report and the JSON (measured on llama3-70b x hetero3-4096, the largest catalog instance: finish
# 0.01 s, report + JSON 0.05-0.1 s on a loaded 2-core machine; the rest is margin for the exit).
# HEURISTIC_SHARE: what the heuristics may use of the time left when an exact method follows (DP takes
# 1-3 s on 4096 GPUs; stopped early it returns its best so far), MIXED_HEURISTIC_SHARE the same on a cluster of
# several GPU types. Why two: on one type the DP heuristic is near-optimal and its polish pays, on several the
# search's eq. LS4 finds the plans it misses. Measured end to end at 10 s (solve_scaling.py, 2026-12-02, load ~1):
# three types, 12 instances, 0.35 against 0.5: the same or a better plan on all 12, a lower gap on 9 of the 10
# that stay open and the same on one (mixtral-8x7b x 1024 x 3 types 6.09 -> 3.43 %); 0.25 lost plans (llama3-70b x 1024 x 3 types x 2
# islands 15.79 -> 25.42 s, the DP cut before its best variant). One type, the 4 rows that stay open: 0.5 better on
# 3 (mixtral-8x7b x 4096 2.28 against 3.16 %), 0.35 on 1. Re-measured after eqs. N16/N17 made the search faster
# (2026-12-02, one type, 1024 and 4096 GPUs x 1-2 islands, dense and MoE, median of 2 runs): 0.3 against 0.5 proves 7
# of 8 against 5 of 8 (llama3-70b x 2 x 512 H100 2.78 % -> 10.0 s, x 2 x 2048 10.05 % -> 8.4 s; mixtral-8x7b x 2 x 2048
# 7.88 -> 2.60 %), and the five both prove sooner (5.7/5.5/8.6/9.0/9.2 s -> 5.2/5.1/7.9/7.6/6.1 s; formulations eq. D2).
# Re-measured 2026-12-03 evening with eqs. N9b, DP8h, LS4c (the quick grid, one run each): several types at 0.2 against
# 0.35, the plain space the same 25 of 30 and plans, the CLI's space lost two plans (llama3-70b x 1024 x 3 types x 2
# islands 14.495 -> 16.379 s), so 0.35 stays (benchmarks/results/solve_scaling.md, "2026-12-03 (evening)").
# Re-measured 2026-12-07 (night), one run each in turn, several types: on 20 instances open at 10 s, 0.15 and 0.05
# proved 3 against 2, but 0.05 lost the plans the DP alone finds (qwen3-235b-a22b x hetero3-4096 2.3779 -> 2.4662 s,
# llama2-70b x 3 types 5.2636 -> 5.4718 s); on 40 mixed shapes (some among those 20), 0.2 proved 27 against 29 and
# lost a plan (llama3-70b x 4 types x 4,096 GPUs 4.5465 -> 4.6011 s), so 0.35 stays (results/ab_dp_share_*_10s.csv).
# MIN_EXACT_S: below this the exact search is skipped and the plan keeps the presolve's eq. B1 bound as its proven gap.
RESERVE_S = 0.3
HEURISTIC_SHARE = 0.3
MIXED_HEURISTIC_SHARE = 0.35
# the uniform baseline where it is only a warm-start candidate (no run asks for it) and the DP heuristic, run before it
# in this process, has a plan: at most UNIFORM_SHARE of the DP's own wall time (at least UNIFORM_MIN_S); it stops with
# its best so far (between signatures). Why: its plan never beat the DP's in 69 solves on record (grids, bench rows,
# outside instances), and where the DP got faster (eq. DP8j) it ran whole: 0.8-0.9 s of a 10 s solve on llama3-70b x
# 4096 x 4 types x 2 islands and mixtral-8x7b x 4096 x 3 / 4 types x 2 islands, cut by the heuristics' deadline at
# 0.005-0.4 s before; with the cap 0.12 s there (a 25 % share still let it run 0.66 s)
UNIFORM_SHARE, UNIFORM_MIN_S = 0.05, 0.05
MIN_EXACT_S = 0.2
# eq. PAR4 (formulations/README.md): with two threads or more, one exact run and the DP heuristic wanted only as its
# warm start, the DP runs on a worker process beside the exact search, which starts from the uniform baseline's plan and
# takes the DP's when it comes back (``solvers/common/late_hint.py``). Not under a ``step`` (the benchmark's wall-clock
# guard and its per-method times are in-process)
DP_BESIDE = True
BESIDE_GRACE_S = 1.0  # s past the DP's own deadline it gets to send its plan back before its worker is killed


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
    def build(cls, model, cluster, training, options, estimator: Estimator | None = None, *,
              profile: Profile | None = None) -> Context:
        """``profile``: measured points (``estimator.load_profiles``, with its fallback policy) for the estimator
        built here; give either it or an ``estimator`` (which carries its own)."""
        if estimator is not None and profile is not None and estimator.profile is not profile:
            raise ValueError("give the profile to the Estimator or to Context.build, not both")
        _refuse_target(model, training, options)
        est = estimator or Estimator(model, cluster, training, profile=profile)
        return cls(model, cluster, training, options, est, presolve.build(model, cluster, training, options, est))


def _refuse_target(model: ModelSpec, training: TrainingSpec, options: SolveOptions) -> None:
    """A target whose engine cannot run the model or the precision at all is refused before solving: every plan
    would fail the checker (an ERROR status after a whole search)."""
    from haap_milp.emit import setup_refusals  # (the emitters load only when a target names one)

    why = setup_refusals(options.target, model, training)
    if why:
        raise HaapInputError(f"--target {options.target} refuses every plan of {model.name} here: "
                             + "; ".join(v.message for v in why) + ". With --target any haap plans it without "
                             "launch files.", field="target", value=options.target)


def _restrict(problem: Problem, keep: list[int]) -> Problem:
    """The problem with only the listed micro-batch variants (sound pruning by eq. B1)."""
    return replace(problem, variants=tuple(problem.variants[i] for i in keep))


def run_method(ctx: Context, method: str, hint_raw: RawResult | None = None) -> tuple[RawResult, list[int]]:
    """Run one method on the presolved problem; returns the raw result and the variant map used."""
    prob = ctx.presolved.problem
    keep = list(range(len(prob.variants)))
    takes_hint = METHODS[resolve(method)].takes_hint
    if takes_hint and hint_raw is not None and hint_raw.objective_s is not None:
        # variants whose lower bound already exceeds the DP plan cannot hold the optimum
        keep = [i for i in keep if ctx.presolved.lower_bounds_s[i] < hint_raw.objective_s * (1 + TIME_RTOL)]
        if hint_raw.assignment is not None and hint_raw.assignment.variant not in keep:
            keep.append(hint_raw.assignment.variant)
        keep.sort()
    sub = _restrict(prob, keep)
    hint = None
    if hint_raw is not None and hint_raw.assignment is not None and ctx.options.warm_start:
        hint = replace(hint_raw.assignment, variant=keep.index(hint_raw.assignment.variant))
    late = late_hint.current()  # eq. PAR4: a warm start still to come, renumbered like the hint
    with late_hint.feeding(late_hint.Mapped(late, keep) if takes_hint and late is not late_hint.NONE else None):
        raw = get_solver(method)(sub, ctx.options, hint=hint) if takes_hint else get_solver(method)(sub, ctx.options)
    if raw.assignment is not None:
        raw = replace(raw, assignment=replace(raw.assignment, variant=keep[raw.assignment.variant]))
    raw.stats.setdefault("variants_searched", len(keep))
    return _with_b1(ctx, raw, keep), keep


def _with_b1(ctx: Context, raw: RawResult, keep: list[int]) -> RawResult:
    """The exact search's bound, raised to the presolve's eq. B1 bound of the variants it searched when that is
    higher (both are lower bounds on every plan of those variants; the variants left out have B1 >= the hint's
    time >= the plan's). Measured: llama3-70b on 64 GPUs of 3 types, 10 s: the search's least open node gave
    56 % gap where B1 gives 39 %. A plan proven this way is OPTIMAL by the search's own rule."""
    lbs = [ctx.presolved.lower_bounds_s[i] for i in keep if i in ctx.presolved.lower_bounds_s]
    if raw.objective_s is None or raw.bound_s is None or not lbs or min(lbs) <= raw.bound_s:
        return raw
    bound = min(min(lbs), raw.objective_s)
    if raw.status == "FEASIBLE" and within_gap(raw.objective_s, bound, ctx.options.relative_gap,
                                               float(raw.stats.get("tolerance_s", 0.0))):
        return replace(raw, bound_s=bound, status="OPTIMAL", message="")
    return replace(raw, bound_s=bound)


Run = tuple[str, "float | None"]  # (method, time limit in s; None: the context's options as they are)
Step = Callable[..., RawResult]  # step(method, limit, fn, *args) -> fn(*args), e.g. under a wall-clock guard


@dataclass
class Orchestrated:
    """What ``orchestrate`` did: one outcome (or, with a ``step``, the exception) per run, in order, and the
    heuristic results the warm start was chosen from."""

    outcomes: list[Outcome | Exception]
    heuristics: dict[str, RawResult | Exception] = field(default_factory=dict)


def _plain_step(_method: str, _limit: float | None, fn: Callable, *args):
    return fn(*args)


def orchestrate(ctx: Context, runs: list[Run], step: Step | None = None,
                deadline: Deadline | None = None, hints: tuple[RawResult, ...] = ()) -> Orchestrated:
    """The planning sequence, the one place it is written: on the presolved ``ctx``, the heuristics (DP, then
    the uniform baseline) run first when a run needs them (asked for, or an exact method to warm-start); the
    better of their plans warm-starts every method that takes a hint; each run is decoded, re-scored and
    checked (``finish``). A run with a time limit runs on the options with that limit (and that solver).

    ``step(method, limit, fn, *args)`` wraps each solver call (the benchmark puts a wall-clock guard there);
    when a ``step`` is given, a run that raises gets the exception as its outcome (a failed heuristic is
    left out of the warm start) instead of ending the sequence.

    ``deadline`` (default: ``deadline.current()``, none outside the CLI) bounds the whole sequence: the
    heuristics get HEURISTIC_SHARE of what is left (all of it when no exact method follows; the uniform baseline as
    a warm-start candidate only, after a DP plan, UNIFORM_SHARE of the DP's time) and stop with their best, each
    exact run its share of the rest less RESERVE_S (never more than its own limit), and once it is interrupted
    (Ctrl-C) every step returns the best it has.

    ``hints``: more candidate warm starts (feasible plans of ``ctx``'s problem found by the caller, e.g.
    ``frontier``'s DP plans on capacities within a budget); the best of them and the heuristics' is used.
    """
    dl = deadline or current()
    with use(dl):
        return _orchestrate(ctx, runs, step, dl, hints)


def _exact_limit(dl: Deadline, own: float, runs_left: int) -> float | None:
    """The exact run's limit within the deadline (None: no time worth starting it)."""
    if not dl.limited and not dl.interrupted:
        return own
    left = (dl.remaining() - RESERVE_S) / max(runs_left, 1)
    return min(own, left) if left >= MIN_EXACT_S else None


def skipped_exact(ctx: Context, method: str, hint: RawResult | None, dl: Deadline) -> RawResult:
    """No time for the exact search: the warm start with the presolve's eq. B1 bound as its proof."""
    why = "interrupted" if dl.interrupted else "time limit reached"
    bound = ctx.presolved.lower_bound_s
    if hint is None or hint.assignment is None:
        return RawResult("NO_SOLUTION", method, bound_s=bound, message=f"{why} before any plan was found",
                         stats={"exact_skipped": 1})
    return RawResult("FEASIBLE", method, assignment=hint.assignment, objective_s=hint.objective_s,
                     bound_s=min(bound, hint.objective_s) if bound is not None else None,
                     message=f"{why} before the exact search; the {hint.solver} plan with the eq. B1 bound",
                     stats={"exact_skipped": 1})


def _orchestrate(ctx: Context, runs: list[Run], step: Step | None, dl: Deadline,
                 hints: tuple[RawResult, ...] = ()) -> Orchestrated:
    catch = step is not None
    step = step or _plain_step
    if not ctx.presolved.problem.variants:
        message = explain_infeasible(ctx)
        return Orchestrated([finish(ctx, RawResult("INFEASIBLE", m, message=message)) for m, _ in runs])
    wanted = {resolve(m) for m, _ in runs}
    hinted = any(METHODS[m].takes_hint for m in wanted)
    heur: dict[str, RawResult | Exception] = {}
    share = (MIXED_HEURISTIC_SHARE if len(ctx.cluster.gpu_types) > 1 else HEURISTIC_SHARE) if hinted else 1.0
    heur_dl = dl.cap(share * (dl.remaining() - RESERVE_S)) if dl.limited else dl
    beside = None if catch else _dp_beside(ctx, runs, wanted, heur_dl)
    try:
        for m in HEURISTICS:
            if (m in wanted or hinted) and not (beside is not None and m == "dp"):
                try:
                    with use(_heuristic_deadline(heur_dl, heur, m, wanted)):
                        heur[m] = step(m, None, run_method, ctx, m)[0]
                except Exception as exc:
                    if not catch:
                        raise
                    log.warning("%s heuristic failed: %s", m, exc)
                    heur[m] = exc
        found = [r for r in heur.values() if isinstance(r, RawResult)] + list(hints)
        warm = _Warm(best_heuristic(*found) if found else None, heur, heur_dl, beside)
        outcomes: list[Outcome | Exception] = []
        exact_left = sum(1 for m, _ in runs if METHODS[resolve(m)].takes_hint)
        for m, limit in runs:
            run_ctx = ctx if limit is None else replace(ctx, options=ctx.options.model_copy(
                update={"time_limit_s": float(limit), "solver": m}))
            raw = heur.get(resolve(m))
            if isinstance(raw, Exception):  # a failed heuristic (only with a step): its run failed with it
                outcomes.append(raw)
                continue
            try:
                if raw is None and METHODS[resolve(m)].takes_hint:
                    exact_left -= 1
                    outcomes.append(_exact(ctx, run_ctx, m, limit, step, dl, warm, exact_left + 1))
                    continue
                if raw is None:
                    raw = step(m, limit, run_method, run_ctx, m)[0]
                outcomes.append(finish(run_ctx, raw))
            except Exception as exc:
                if not catch:
                    raise
                outcomes.append(exc)
        return Orchestrated(outcomes, heur)
    finally:  # (a run that raised: the DP's worker does not outlive it)
        if beside is not None:
            beside.close()


def _heuristic_deadline(heur_dl: Deadline, heur: dict, m: str, wanted: set) -> Deadline:
    """The heuristics' deadline for heuristic ``m``; the uniform baseline as a warm-start candidate only, after a DP
    plan, capped at UNIFORM_SHARE of the DP's time (UNIFORM_MIN_S at least)."""
    dp = heur.get("dp")
    if m != "uniform" or m in wanted or not isinstance(dp, RawResult) or dp.assignment is None:
        return heur_dl
    return heur_dl.cap(max(UNIFORM_MIN_S, UNIFORM_SHARE * dp.wall_time_s))


@dataclass
class _Warm:
    """What the exact runs start from: the best heuristic plan (``hint``), the heuristics' results (``heur``, by
    method) and their deadline, and eq. PAR4's DP still running beside (``beside``; None once collected)."""

    hint: RawResult | None
    heur: dict
    heur_dl: Deadline
    beside: late_hint.Beside | None = None

    def collect(self, dl: Deadline) -> RawResult | None:
        """Eq. PAR4: the DP's result (``_collect``; None: none), after which the better of it and ``hint`` is
        ``hint``."""
        if self.beside is None:
            return None
        got, self.beside = _collect(self.beside, self.heur, dl, self.heur_dl), None
        if got is not None:
            self.hint = best_heuristic(*(r for r in (got, self.hint) if r is not None))
        return got


def _exact(ctx: Context, run_ctx: Context, m: str, limit, step: Step, dl: Deadline, warm: _Warm,
           exact_left: int) -> Outcome:
    """One exact run within its share of the command's time, warm-started (eq. PAR4: with the DP's plan still to
    come where it runs beside), decoded and checked."""
    own = run_ctx.options.time_limit_s
    budget = _exact_limit(dl, own, exact_left)
    if budget is None:
        warm.collect(dl)
        return finish(run_ctx, skipped_exact(ctx, m, warm.hint, dl))
    if budget < own:
        run_ctx = replace(run_ctx, options=run_ctx.options.model_copy(update={"time_limit_s": budget}))
    beside = warm.beside
    with late_hint.feeding(beside if ctx.options.warm_start else None):
        raw = step(m, limit, run_method, run_ctx, m, warm.hint)[0]
    if beside is not None:
        raw = _with_late(ctx, raw, warm.collect(dl))
        raw.stats["dp_beside"] = 1
    for h, r in warm.heur.items():  # what it started from, and the heuristics' own wall time (s)
        if isinstance(r, RawResult):
            raw.stats[f"{h}_objective_s"] = r.objective_s if r.objective_s is not None else "none"
            raw.stats[f"{h}_wall_s"] = round(r.wall_time_s, 4)
    return finish(run_ctx, raw)


def _dp_beside(ctx: Context, runs: list[Run], wanted: set, heur_dl: Deadline):
    """Eq. PAR4's DP heuristic started on a worker process, or None where it runs first in this one (DP_BESIDE)."""
    if not (DP_BESIDE and len(ctx.cluster.gpu_types) == 1 and ctx.options.warm_start and "dp" in HEURISTICS
            and "dp" not in wanted and not heur_dl.interrupted
            and sum(1 for m, _ in runs if METHODS[resolve(m)].takes_hint) == 1 and worker.forks(ctx.options.threads)):
        return None

    def run() -> RawResult:
        with use(heur_dl):
            return run_method(ctx, "dp")[0]

    try:
        return late_hint.Beside(run, interrupt=heur_dl.interrupt)
    except OSError:  # (no fork: the DP runs first in this process, as with one thread)
        return None


def _collect(beside, heur: dict, dl: Deadline, heur_dl: Deadline) -> RawResult | None:
    """Eq. PAR4: the DP's result, also into ``heur``, once it is back: it stops at its own deadline, or at once on
    Ctrl-C, which is passed on to it (None if it does not come back). A DP that failed, or whose process died, is
    logged and left out: the exact search's plan stands without it."""
    got = beside.result(min(heur_dl.remaining(), 1e6) + BESIDE_GRACE_S, stop=lambda: dl.interrupted)
    if isinstance(got, BaseException):
        log.warning("the DP heuristic failed beside the exact search: %s", got)
        return None
    if got is None:
        log.warning("the DP heuristic did not come back (%s)", "interrupted" if dl.interrupted else "past its deadline")
        return None
    heur["dp"] = got
    return got


def _with_late(ctx: Context, raw: RawResult, dp: RawResult | None) -> RawResult:
    """The exact result with eq. PAR4's DP plan where that is better (it came back after the search ended, or the
    search stopped before taking it). The bound stays the search's; the plan is proven (OPTIMAL) where it lies within
    the gap of it, by ``_with_b1``'s rule."""
    if dp is None or dp.assignment is None or dp.objective_s is None or (
            raw.objective_s is not None and raw.objective_s <= dp.objective_s):
        return raw
    obj, bound = dp.objective_s, raw.bound_s
    proven = raw.status == "OPTIMAL" or (bound is not None and within_gap(
        obj, bound, ctx.options.relative_gap, float(raw.stats.get("tolerance_s", 0.0))))
    why = "interrupted" if raw.stats.get("interrupted") else "the time limit was reached"
    message = "" if proven else (f"gap {(obj - bound) / obj:.2%} when {why}" if bound is not None else
                                 "the DP heuristic's plan; the exact search proved no bound")
    return replace(raw, status="OPTIMAL" if proven else "FEASIBLE", assignment=dp.assignment, objective_s=obj,
                   message=message, stats={**raw.stats, "late_dp_plan": 1})


def finish(ctx: Context, raw: RawResult) -> Outcome:
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
        gap=relative_gap(objective, bound), wall_time_s=raw.wall_time_s,
        plan=plan, message=message, stats=stats,
    )
    return Outcome(result, pre, est, viol, ctx.estimator, raw.assignment)


def solve(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions, *,
          profile: Profile | None = None, deadline: Deadline | None = None) -> Outcome:
    """Plan: DP heuristic and uniform baseline first (the better is the warm start), then the exact solver.
    ``profile``: measured points (``estimator.load_profiles``) replacing the analytic prices they cover;
    ``deadline`` bounds all of it (``orchestrate``)."""
    t0 = time.perf_counter()
    with use(deadline):
        ctx = Context.build(model, cluster, training, options, profile=profile)
    out = orchestrate(ctx, [(options.solver, None)], deadline=deadline).outcomes[0]
    total = time.perf_counter() - t0
    if not ctx.presolved.problem.variants:
        out.result = out.result.model_copy(update={"wall_time_s": out.result.wall_time_s + total})
        return out
    out.result = out.result.model_copy(update={"stats": {**out.result.stats, "total_wall_s": round(total, 4),
                                                          "presolve_s": ctx.presolved.stats.get("presolve_s", 0.0)}})
    return out


def compare(model, cluster, training, options, methods=LISTED, *, profile: Profile | None = None,
            deadline: Deadline | None = None) -> dict[str, Outcome]:
    """Every method on the same presolved problem; exact ones warm-started from the best heuristic."""
    with use(deadline):
        ctx = Context.build(model, cluster, training, options, profile=profile)
    return dict(zip(methods, orchestrate(ctx, [(m, None) for m in methods], deadline=deadline).outcomes))


def best_heuristic(*raws: RawResult) -> RawResult:
    """The warm start: the better of the DP heuristic and the uniform baseline (so an exact plan is
    never worse than either, up to the requested gap)."""
    found = [r for r in raws if r.objective_s is not None and r.assignment is not None]
    return min(found, key=lambda r: r.objective_s) if found else raws[0]


def explain_infeasible(ctx: Context) -> str:
    """The binding limit, in one sentence, and the smallest cheap change that could help."""
    from haap_milp.explain import infeasibility_reason

    return infeasibility_reason(ctx)
