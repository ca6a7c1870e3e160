"""One node model solved by HiGHS' branch and bound through highspy: the MILP method's engine (``milp.py``, which
falls back to CBC) and CP-SAT's racer (eq. N21, ``cpsat._race_node``; on a forked child where it can, eq. N21b)."""

from __future__ import annotations

import math
import time

import numpy as np

from haap_milp import worker
from haap_milp.deadline import Deadline
from haap_milp.problem import Assignment, Problem, evaluate
from haap_milp.solvers.common.branch_and_bound import VariantResult
from haap_milp.solvers.common.lp import columns, highs_model, highspy, run
from haap_milp.solvers.common.model import LinModel, decode, start_values
from haap_milp.specs import SolveOptions

# eq. N21b: HiGHS looks at its stop flag only between the phases of its root node; once a race on the helper thread
# has waited for it this long after the other racer finished, this process forks its racers (a fork and its
# copy-on-write pages cost 20-40 ms a race: on the default bench, 65 races, 1.4 s of such waits in all, forking every
# racer cost 2 s more; on llama3-70b x 256 x 2 types x 2 islands at 30 s, waits of 4.7, 3.7, 2.0 and 1.7 s)
LINGER_S = 0.3
_lingered = False  # this process has seen a race wait LINGER_S for HiGHS (inherited by the children it forks)
KILL_SLACK_S = 0.5  # s past its time share a forked HiGHS racer gets before it is killed
WAIT_S = 0.01  # s between looks at the race's end while waiting for the forked racer (race.POLL_S's step)
ABS_GAP_S = 1e-6  # HiGHS mip_abs_gap (its default): an optimum is proven to within this many seconds
# eq. N23: with a cut-off (an incumbent in hand) HiGHS runs without its sub-MIP and root primal heuristics: the node is
# mostly a proof that no plan lies below the cut-off, and RENS alone took 1.4 of 2.6 s on the node that held gpt3-13b x
# hetero3-4096 open (46 sub-MIPs); its branching still finds plans (formulations/README.md, N23)
PROOF_OPTIONS = {"mip_heuristic_run_rens": False, "mip_heuristic_run_rins": False,
                 "mip_heuristic_run_root_reduced_cost": False, "mip_heuristic_run_feasibility_jump": False}


def column_order(n: int) -> np.ndarray:
    """The MILP's column order: the variables sorted by the string ``f"{i}_"`` (0, 1, 10, 100, ..., 11,
    ...), the order PuLP gave HiGHS before this module drove highspy itself (PuLP sorts its variables
    by name, and the names were ``v{i}_...``). HiGHS' branch and bound depends on the column order; kept
    so that the search is the one measured before. Measured (islands case of
    tests/test_planner_integration.py, loaded machine): this order 17-18 s to OPTIMAL, the LinModel's own
    order 30-34 s (two nodes hit their time share instead of proving infeasibility at once)."""
    return np.array(sorted(range(n), key=lambda i: f"{i}_"), dtype=np.int64)


def race_node(problem: Problem, lm: LinModel, cutoff: float | None, time_s: float, hint: Assignment | None,
              options: SolveOptions, race) -> VariantResult:
    """HiGHS on one node as a racer of eq. N21 (``common.race``), one thread, stopped by the race's end."""
    if race.interrupted:
        return VariantResult("NO_SOLUTION", stats={"backend": "highs"})
    one = options.model_copy(update={"threads": 1})
    return highs_node(problem, lm, cutoff, time_s, hint, one, time.perf_counter(), race)


def lingered(seconds: float) -> None:
    """Eq. N21b: a race on the helper thread ended ``seconds`` after the other racer had finished the node; past
    LINGER_S, this process runs its HiGHS racers on forked children from now on (``fork_racer``)."""
    global _lingered
    _lingered = _lingered or seconds > LINGER_S


def fork_racer(problem: Problem, lm: LinModel, cutoff: float | None, time_s: float, hint: Assignment | None,
               options: SolveOptions) -> worker.Worker | None:
    """Eq. N21b: once this process has seen HiGHS linger (``lingered``), ``race_node``'s HiGHS begun on a forked child
    (``worker.start``); None before that, or without a child: the racer runs on the race's helper thread. Forked
    before the other racer starts, from the search's own thread."""
    if not _lingered:
        return None
    one = options.model_copy(update={"threads": 1})
    return worker.start(lambda: highs_node(problem, lm, cutoff, time_s, hint, one, time.perf_counter()))


def await_racer(child: worker.Worker, time_s: float, race, dl: Deadline) -> VariantResult:
    """Eq. N21b: the forked HiGHS racer's result, or NO_SOLUTION once the race has ended, Ctrl-C (``dl``) or KILL_SLACK_S
    past its time; the child is then killed, so its CPU is free at once (HiGHS looks at its stop flag only between
    phases: measured, a root node went on for 3.3 s after it, while CP-SAT had closed the node)."""
    end = time.monotonic() + time_s + KILL_SLACK_S
    try:
        while not (race.interrupted or dl.interrupted) and time.monotonic() < end:
            back, got = child.reply(WAIT_S)
            if not back:
                continue
            if isinstance(got, BaseException):
                raise got
            return got
        return VariantResult("NO_SOLUTION", stats={"backend": "highs", "racer_killed": 1})
    finally:
        child.close()


def highs_node(problem: Problem, lm: LinModel, cutoff: float | None, time_s: float, hint: Assignment | None,
               options: SolveOptions, t0: float, race=None) -> VariantResult:
    """HiGHS' branch and bound on one node model with the cut-off row of eq. X2 and the hint as its start; the plan's
    T is ``evaluate`` of the decoded plan, the bound HiGHS' dual bound (``race``: eq. N21, its end stops the run)."""
    order = column_order(len(lm.names))
    col = columns(order)
    h = highs_model(lm, integer=True, cutoff_s=cutoff, cutoff_tol_s=ABS_GAP_S, order=order)  # cutoff: eq. X2
    vals = start_values(lm, hint) if hint is not None else None
    if vals is not None:
        n = len(lm.names)  # eq. N2c: each expression column at its value (highs_model puts them after the variables)
        full = {**{col[v]: x for v, x in vals.items()},
                **{n + e: sum(c * vals[v] for v, c in terms.items()) for e, terms in enumerate(lm.exprs)}}
        h.setSolution(len(full), np.fromiter(full.keys(), np.int64, len(full)).astype(np.int32),
                      np.fromiter(full.values(), np.float64, len(full)))
    build_s = time.perf_counter() - t0
    for key, value in (("time_limit", float(max(time_s - build_s, 0.01))), ("threads", int(options.threads)),
                       ("mip_rel_gap", float(options.relative_gap)), ("random_seed", int(options.seed)),
                       ("mip_abs_gap", ABS_GAP_S)):
        h.setOptionValue(key, value)
    for key, value in (PROOF_OPTIONS.items() if cutoff is not None else ()):
        h.setOptionValue(key, value)
    run(h, race)
    ms = h.getModelStatus()
    info = h.getInfo()
    stats = {"build_s": round(build_s, 4), "vars": len(lm.names), "rows": len(lm.rows), "hinted": int(vals is not None),
             "tolerance_s": ABS_GAP_S, "backend": "highs", "gap_rel": options.relative_gap,
             "highs_status": h.modelStatusToString(ms), "nodes": int(info.mip_node_count)}
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    bound = info.mip_dual_bound + lm.obj_const if math.isfinite(info.mip_dual_bound) else None
    status = highspy.HighsModelStatus
    if ms == status.kInfeasible:
        return VariantResult("INFEASIBLE", stats=stats)
    if has_sol:
        a = decode(lm, np.asarray(h.getSolution().col_value)[col])
        # HiGHS' rows hold within its primal feasibility tolerance (1e-7), so its tau and sigma may sit that far below
        # the plan's own, (M - 1) tau amplifying it: the plan's T (evaluate) can exceed HiGHS' objective, to which the
        # dual bound is proven within ABS_GAP_S. Measured: a random problem with M = 16, HiGHS' objective and bound
        # 0.0762289 s, the plan 0.0762309 s (the brute-force optimum)
        model_err = evaluate(problem, a) - (info.objective_function_value + lm.obj_const)
        stats["tolerance_s"] = ABS_GAP_S + max(0.0, float(model_err))
        return VariantResult("OPTIMAL" if ms == status.kOptimal else "FEASIBLE", a, bound, stats)
    if ms in (status.kTimeLimit, status.kInterrupt):
        return VariantResult("NO_SOLUTION", bound_s=bound, stats=stats)
    return VariantResult("ERROR", stats=stats, message=f"HiGHS: {stats['highs_status']}")
