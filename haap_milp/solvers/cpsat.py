"""CP-SAT on the slot formulation (formulations/README.md; scaling: formulations/cpsat.md).

One model per micro-batch variant (common.branch_and_bound). Times are scaled to integers once per
model: every time coefficient a becomes ceil(a * S) (eq. CP1), so the integer objective
over-estimates the true one by at most W units (eq. CP2); the returned objective is
``evaluate`` of the decoded plan and the bound is (CP-SAT bound - W) / S, a valid lower
bound on the true optimum (eq. CP3).
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
import threading
import time
import types

import numpy as np

from haap_milp.deadline import current
from haap_milp.pipeline import TIME_RTOL
from haap_milp.problem import Assignment, Problem, RawResult, evaluate
from haap_milp.solvers.common import LinModel, Tables, VariantBound, VariantResult, decode, run_variants
from haap_milp.solvers.common.highs_node import await_racer, fork_racer, lingered, race_node
from haap_milp.solvers.common.model import start_values
from haap_milp.solvers.common.race import race
from haap_milp.specs import SolveOptions


class _Pandas:
    """Stands for pandas inside ortools' cp_model: its pandas helpers (``new_int_var_series`` and kin, which haap
    never calls) import pandas when they first touch it."""

    def __getattr__(self, name: str):
        import pandas

        return getattr(pandas, name)


def _import_cp_model():
    """ortools' ``cp_model`` without importing pandas, which it imports at the top only for its Series helpers:
    0.35-1.0 s of every solve's start-up (``python -X importtime``, idle to load 5 on 2 cores), more than the
    rest of ``cp_model``. While it loads, ``pandas`` is a stub whose ``Index`` / ``Series`` are classes nothing is an
    instance of (cp_model names them in module-level type aliases); after, cp_model's ``pd`` is ``_Pandas``.
    Where pandas is already imported the plain import is used."""
    if "pandas" in sys.modules:
        from ortools.sat.python import cp_model as mod

        return mod
    stub = types.ModuleType("pandas")
    stub.Index = type("Index", (), {})
    stub.Series = type("Series", (), {})
    sys.modules["pandas"] = stub
    try:
        from ortools.sat.python import cp_model as mod
    finally:
        if sys.modules.get("pandas") is stub:
            del sys.modules["pandas"]
    if getattr(mod, "pd", None) is stub:
        mod.pd = _Pandas()
    return mod


cp_model = _import_cp_model()
log = logging.getLogger(__name__)
SCALE_TARGET = 1e7  # integer units of the reference stage time (eq. CP1)
INTERLEAVE = True
SUBSOLVERS = ("max_lp", "default_lp")
LOG = False
RACE = True  # eq. N21: HiGHS races CP-SAT on each node when there are two threads or more
# eq. N21: a model this small (the search's own "small" size, SMALL_MODEL) is solved in milliseconds; racing it
# cost 2 ms more a node (median 6.1 -> 8.0 ms over 40 random node models) and its plan would hang on the timing
RACE_MIN_VARS = 400
# eq. N21b: the HiGHS racer on a forked child, killed when the race ends, once this process has seen it go on past a node
# CP-SAT had closed (highs_node.LINGER_S); False: always on the race's helper thread
FORK_RACER = True
FINISHED = ("OPTIMAL", "INFEASIBLE")  # a racer's statuses that end the race (the node needs no more time)
PROBING = 0  # presolve probing on this model creates millions of binary clauses (measured), so off


MIN_TIME_S = 1e-9  # s; floor of the time scale's reference (a problem whose layers all take 0 s)
ROUND_SLACK = 1e-9  # absolute slack before ceil/floor of a scaled row bound (float noise, not a tolerance)
INT_LIMIT = 2**62  # the largest |integer| of a bound or coefficient (eq. CP1): int64, with room for a row's sums


class Unscalable(ValueError):
    """A node's times do not fit 64-bit integers at its time scale (eq. CP1): the times of its plans span more than
    about 1e11 times the reference stage time (an absurd link or GPU rate); the node is an engine error, not a crash."""


def _fits(what: str, values, S: float) -> None:
    """Raises Unscalable where one of the integers ``values`` (of ``what``) reaches INT_LIMIT."""
    big = max((abs(v) for v in values), default=0)
    if big >= INT_LIMIT:
        raise Unscalable(f"CP-SAT cannot scale this node to integers: {what} of {big / S:.3g} s is more than "
                         f"{INT_LIMIT / SCALE_TARGET:.2g} times its stage time (eq. CP1)")


def solve(problem: Problem, options: SolveOptions | None = None, hint: Assignment | None = None) -> RawResult:
    """Exact solve with OR-Tools CP-SAT (status, objective = evaluate(plan), proven bound, gap); with two threads
    or more and ``RACE``, HiGHS races CP-SAT on every node on one of them (eq. N21)."""
    options = options or SolveOptions()
    return run_variants(problem, options, hint, "cpsat", _race_node if _races(options) else _solve_node)


def _races(options: SolveOptions) -> bool:
    if not RACE or options.threads < 2:
        return False
    from haap_milp.solvers.common.lp import highspy

    return highspy is not None


def _race_node(problem: Problem, lm: LinModel, b: VariantBound, cutoff: float | None, time_s: float,
               hint: Assignment | None, options: SolveOptions, primal: bool = False) -> VariantResult:
    """Eq. N21: CP-SAT on ``threads - 1`` workers here and HiGHS on one thread (``common.race``) on the same node
    model with the same cut-off and time; the first to finish the node (OPTIMAL or INFEASIBLE) stops the other.
    The result (``_merge``): the finished racer's status and plan, the higher of their bounds (each bounds every plan
    of the node with T <= cutoff, eqs. CP3 and MILP's dual bound) and the larger tolerance."""
    if primal or len(lm.names) <= RACE_MIN_VARS:
        return _solve_node(problem, lm, b, cutoff, time_s, hint, options, primal)
    rest = options.model_copy(update={"threads": options.threads - 1})
    child = fork_racer(problem, lm, cutoff, time_s, hint, options) if FORK_RACER else None  # eq. N21b
    dl, ended = current(), []

    def here(r):
        try:
            return _solve_node(problem, lm, b, cutoff, time_s, hint, rest, race=r)
        finally:
            ended.append(time.monotonic())

    mine, theirs = race(
        here,
        (lambda r: race_node(problem, lm, cutoff, time_s, hint, options, r)) if child is None else
        (lambda r: await_racer(child, time_s, r, dl)),
        done=lambda res: res.status in FINISHED,
        failed=lambda exc: VariantResult("ERROR", message=f"{type(exc).__name__}: {exc}"))
    if child is None and ended and mine.status in FINISHED:  # eq. N21b: how long HiGHS went on after CP-SAT's finish
        lingered(time.monotonic() - ended[0])
    return _merge(problem, mine, theirs)


def _merge(problem: Problem, mine: VariantResult, theirs: VariantResult) -> VariantResult:
    """The two racers' results as one (``_race_node``); an ERROR racer counts only when both failed. The plan: the
    finished racer's, or the other's where that is lower by more than TIME_RTOL (a tie keeps the finisher's, so
    the plan changes with the timing only as far as which racer finishes first)."""
    ok = [x for x in (mine, theirs) if x.status != "ERROR"]
    if not ok:
        return mine
    won = next((x for x in ok if x.status in FINISHED), None)
    ranked = sorted((x for x in ok if x.assignment is not None), key=lambda x: x is not won)  # the finisher's first
    plan, best = None, math.inf
    for x in ranked:
        value = evaluate(problem, x.assignment)
        if value < best * (1 - TIME_RTOL):
            plan, best = x.assignment, value
    # INFEASIBLE keeps the other racer's plan, if any: offered all the same (its T is at the cut-off within the
    # racers' tolerances)
    status = won.status if won is not None else ("FEASIBLE" if plan is not None else "NO_SOLUTION")
    bounds = [x.bound_s for x in ok if x.bound_s is not None]
    stats = {**theirs.stats, **mine.stats}
    stats["tolerance_s"] = max(float(x.stats.get("tolerance_s", 0.0)) for x in ok)
    stats["race"] = "cpsat" if won is mine else "highs" if won is theirs else "none"
    bound = max(bounds) if bounds and status != "INFEASIBLE" else None
    return VariantResult(status, plan, bound, stats)


def _scale(t: Tables, b: VariantBound) -> float:
    """S such that the reference stage time (the node's upper tau, at most twice its lower tau)
    is SCALE_TARGET."""
    ref = min(t.tau_ub if t.tau_ub is not None else math.inf, 2.0 * b.tau_lb if b.tau_lb > 0 else math.inf)
    if not math.isfinite(ref):
        ref = 2.0 * b.tau_lb
    if not ref > 0:
        ref = float(max(t.coef["layer_time"].max(), MIN_TIME_S))
    return SCALE_TARGET / ref


def _slack(t: Tables) -> tuple[int, int, int]:
    """Integer over-estimate of tau, sigma and the whole objective (eq. CP2)."""
    # in-flight rows (eq. T2) and sync rows (eq. T3) each round up by at most L + 2K units
    tau_w, sig_w = t.L + 2 + 2 * t.K, 2 * t.L + 3 + 2 * t.K
    return tau_w, sig_w, t.tau_weight * tau_w + (t.L + 2 + t.K) + sig_w


def _int_row(lm: LinModel, row, S: float) -> tuple[list, int]:
    """A row's integer coefficients and constant (eq. CP1): ceil(a * S) on the time coefficients of a
    defining row (t_int >= S * t), floor on the C1 cut (stays valid), the time variables' own unchanged. (For the
    warm start and single rows; ``_int_coefs`` is the same rule on every row at once, tests/test_cpsat_rows.py.)"""
    if row.kind == "exact":
        return [int(c) for c in row.coef], 0
    aux = lm.aux
    if row.kind == "tdef":
        return [math.ceil(c * S) if v not in aux else int(c) for v, c in zip(row.idx, row.coef)], math.ceil(row.const * S)
    return [math.floor(c * S) if v != lm.tau else int(c) for v, c in zip(row.idx, row.coef)], 0


def _int_rows(cp: cp_model.CpModel, lm: LinModel, x: list, S: float) -> None:
    """The rows of ``lm`` (but eq. TX1e's) as CP-SAT linear constraints in integer units (eq. CP1, ``_int_row``'s
    rounding, all rows at once in arrays), written into the model's proto as ``add_linear_constraint`` writes them
    (variables ascending, repeats summed, zeros dropped, the constant moved into the domain): per row, that call and
    ``_int_row`` took 1.77 of a node's 5.4 s of engine time on MoE models (measured: 32,554 rows in 29 node models,
    mixtral-8x22b x hetero3-1024). A row whose coefficients leave int64, or whose bounds cross, goes the library's
    way (its error, or its empty domain)."""
    rows = [row for row in lm.rows if row.kind != "tcap"]  # (eq. TX1e: in the objective's units, ``_time_cap``)
    ints = _int_coefs(lm, rows, S, np.array([v.index for v in x], np.int64))
    if ints is None:
        for row in rows:
            _library_row(cp, lm, x, S, row)
        return
    var, coef, ends = ints
    cons = cp.proto.constraints
    for r, row in enumerate(rows):
        const = math.ceil(row.const * S) if row.kind == "tdef" else 0
        lo, hi = _int_bounds(row)
        if lo is not None and hi is not None and lo > hi:
            _library_row(cp, lm, x, S, row)
            continue
        lin = cons.add().linear
        lin.vars.extend(var[ends[r]:ends[r + 1]])
        lin.coeffs.extend(coef[ends[r]:ends[r + 1]])
        # (the library's ends: -INT_MAX is a number, moved by the constant down to INT_MIN at most; INT_MAX is +inf)
        lin.domain.extend((max(cp_model.INT_MIN, -cp_model.INT_MAX - const) if lo is None else lo - const,
                           cp_model.INT_MAX if hi is None else hi - const))


def _int_coefs(lm: LinModel, rows: list, S: float, index: np.ndarray) -> tuple[list, list, list] | None:
    """``_int_row``'s coefficients of ``rows`` (``LinModel.dense``'s), per row by ascending CP-SAT variable (``index``:
    by model variable), zeros dropped: (variables, coefficients, row r's slice ends[r]:ends[r + 1]); None when one
    leaves int64 (2**62 here)."""
    rid, var, val = lm.dense(rows)
    kind = np.array([_KIND.get(row.kind, 2) for row in rows], np.int64)[rid]
    aux = (var == lm.tau) | (var == lm.sigma)
    up, down = (kind == 1) & ~aux, (kind == 2) & (var != lm.tau)  # tdef: ceil(a S); the C1 cut: floor(a S)
    got = np.where(up, np.ceil(val * S), np.where(down, np.floor(val * S), np.trunc(val)))
    if not np.all(np.abs(got) < 2.0**62):
        return None
    var = index[var]
    if np.any((np.diff(var) <= 0) & (np.diff(rid) == 0)):  # (CP-SAT's variables in another order than the model's)
        order = np.lexsort((var, rid))
        rid, var, got = rid[order], var[order], got[order]
    got = got.astype(np.int64)
    keep = got != 0
    rid, var, got = rid[keep], var[keep], got[keep]
    ends = np.searchsorted(rid, np.arange(len(rows) + 1))
    return var.tolist(), got.tolist(), ends.tolist()


_KIND = {"exact": 0, "tdef": 1}  # _int_row's cases (any other kind: the C1 cut's floor)


def _library_row(cp: cp_model.CpModel, lm: LinModel, x: list, S: float, row) -> None:
    """One row by ``add_linear_constraint`` (eq. CP1 by ``_int_row``)."""
    coefs, const = _int_row(lm, row, S)
    _fits("a row's time", [*coefs, const], S)
    expr = cp_model.LinearExpr.weighted_sum([x[i] for i in row.idx], coefs) + const
    lo, hi = _int_bounds(row)
    cp.add_linear_constraint(expr, -cp_model.INT_MAX if lo is None else lo, cp_model.INT_MAX if hi is None else hi)


def _int_bounds(row) -> tuple[int | None, int | None]:
    """A row's bounds as integers (ROUND_SLACK of float noise forgiven); None where infinite."""
    return (None if row.lb == -math.inf else math.ceil(row.lb - ROUND_SLACK),
            None if row.ub == math.inf else math.floor(row.ub + ROUND_SLACK))


def _variables(cp: cp_model.CpModel, lm: LinModel, t: Tables, b: VariantBound, S: float) -> tuple[list, dict]:
    """CP-SAT variables and the lower bounds of the time variables (IntVar.Proto() is not used:
    in OR-Tools 9.15 it returned a dangling view and corrupted memory, measured)."""
    tau_w, sig_w, _ = _slack(t)
    c = t.coef
    worst_t = (t.L * c["layer_time"].max() + c["first_time"].max() + c["last_time"].max()
               + max(t.K - 1, 1) * float(t.p2p.max()) * max(1, t.vpp))  # eq. T2 in-flight (I2-I3) term included
    worst_s = (c["sync_fixed"] + t.L * c["sync_per_layer"] + c["sync_first"] + c["sync_last"]).max()
    tau_hi = t.tau_ub if t.tau_ub is not None else worst_t
    x = []
    lows = {lm.tau: math.floor(b.tau_lb * S * (1 - 1e-12)), lm.sigma: 0}
    lows["hi"] = {lm.tau: math.ceil(tau_hi * S) + tau_w, lm.sigma: math.ceil(worst_s * S) + sig_w}
    _fits("the slowest stage time", [lows["hi"][lm.tau]], S)
    _fits("the slowest synchronisation", [lows["hi"][lm.sigma]], S)
    for i, name in enumerate(lm.names):
        if i == lm.tau:
            x.append(cp.new_int_var(lows[i], lows["hi"][i], name))
        elif i == lm.sigma:  # eq. N22's cap (lm.ub) as an integer bound: the lifted rows exceed sigma * S by < sig_w
            hi = lows["hi"][i] if not math.isfinite(lm.ub[i]) else min(lows["hi"][i], math.ceil(lm.ub[i] * S) + sig_w)
            x.append(cp.new_int_var(0, max(hi, 0), name))
        elif lm.lb[i] == 0 and lm.ub[i] == 1:
            x.append(cp.new_bool_var(name))
        else:
            x.append(cp.new_int_var(int(lm.lb[i]), int(lm.ub[i]), name))
    return x, lows


def _objective(lm: LinModel, x: list, S: float, k: int = 1, terms: tuple[dict, float] | None = None):
    """Eq. T1 in integer units: ceil(a * S) on the time terms, the integer weights of tau and sigma kept.
    ``k`` (eq. I1, vpp): the objective times k, so tau's weight k M - 1 is an integer too. ``terms``: another
    expression of the same kind ({var: s}, constant s) instead of the objective."""
    obj, const = lm.objective() if terms is None else terms
    idx = list(obj)
    coefs = [round(obj[i] * k) if i in lm.aux else math.ceil(obj[i] * S * k) for i in idx]
    _fits("an iteration-time term", [*coefs, math.ceil(const * S * k)], S * k)
    return cp_model.LinearExpr.weighted_sum([x[i] for i in idx], coefs) + math.ceil(const * S * k)


def _time_cap(cp: cp_model.CpModel, lm: LinModel, x: list, S: float, kv: int, W: int) -> None:
    """Eq. TX1e in integer units, as eq. CP4: T <= T_max implies T_int <= S T_max + W (a relaxation by at most
    W / S seconds: the bound stays a bound; a plan just past T_max is refused by ``problem.violations``)."""
    for row in lm.rows:
        if row.kind == "tcap":
            expr = _objective(lm, x, S, kv, (dict(zip(row.idx, row.coef)), row.const))
            cp.add(expr <= math.floor(row.ub * S * kv + ROUND_SLACK) + math.ceil(W * kv))


def _add_hint(cp: cp_model.CpModel, lm: LinModel, x: list, S: float, lows: dict, hint: Assignment | None) -> bool:
    vals = start_values(lm, hint, lambda row: _int_row(lm, row, S), lows) if hint is not None else None
    if vals is None:
        return False
    if any(vals[tv] > lows["hi"][tv] for tv in lm.aux):
        # the hint lies outside this node's tau interval: a hint out of its variable's domain
        # made CP-SAT 9.15 abort ("heuristics.fixed_search != nullptr") with interleave_search
        return False
    for i, val in vals.items():
        cp.add_hint(x[i], round(val))
    return True


def _solve_keeping_sigint(solver: cp_model.CpSolver, cp: cp_model.CpModel) -> int:
    """``solver.solve(cp)``; where CP-SAT catches SIGINT itself (outside the CLI), Python's handler is put back after
    it: OR-Tools leaves SIGINT at the system default when it is done, so a later Ctrl-C killed the interpreter (a
    notebook's kernel) instead of raising KeyboardInterrupt (measured: exit by signal after one in-process solve).
    Only the main thread can set a handler; the race's helper thread (eq. N21) leaves it to the main thread's."""
    keep = solver.parameters.catch_sigint_signal and threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if keep else None
    try:
        return solver.solve(cp)
    finally:
        if keep and before is not None:
            signal.signal(signal.SIGINT, before)


def _params(options: SolveOptions, time_s: float, primal: bool = False) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = max(time_s, 0.01)
    p.num_workers = options.threads
    p.random_seed = options.seed
    p.relative_gap_limit = options.relative_gap
    p.log_search_progress = LOG
    p.cp_model_probing_level = PROBING
    # Ctrl-C goes to deadline.interrupt (which calls stop_search) when the CLI routes it there; CP-SAT's own
    # handler would end only this node, as if its time were up, and the search would go on
    p.catch_sigint_signal = not current().handles_sigint
    # determinism: interleaved search gives the same result for the same input and thread count
    # (sat_parameters.proto, interleave_search) as long as the time limit is not what stops it
    # the primal phase (eq. N3, large models under a wall-clock limit, which no setting makes
    # reproducible) runs the default portfolio so that it can take the hint
    p.interleave_search = INTERLEAVE and options.threads > 1 and not primal
    # measured on the synthetic scaling instances: the default 2-worker portfolio has no worker
    # with the full LP and its bound hardly moves; max_lp (all rows in the LP) + default_lp does
    if not primal:
        p.subsolvers.extend(SUBSOLVERS)
    if p.interleave_search:
        p.interleave_batch_size = 1  # measured: larger batches wait seconds on tiny models
    return solver


def _solve_node(problem: Problem, lm: LinModel, b: VariantBound, cutoff: float | None, time_s: float,
                hint: Assignment | None, options: SolveOptions, primal: bool = False, race=None) -> VariantResult:
    """CP-SAT on one (variant, tau interval) node model; ``primal``: the default portfolio (with
    its LNS workers) to improve the warm start instead of the LP-heavy bounding workers."""
    t0 = time.perf_counter()
    t = lm.t
    S = _scale(t, b)
    _, _, W = _slack(t)
    if problem.variants[t.v].extra is not None:  # eq. EX1: a rounded-up constant on each used slot
        W += t.K
    kv = max(1, t.vpp)  # eq. I1: tau's weight M - 1/vpp; the CP-SAT objective is kv times T (kv = 1: T itself)
    cp = cp_model.CpModel()
    try:
        x, lows = _variables(cp, lm, t, b, S)
        _int_rows(cp, lm, x, S)
        obj = _objective(lm, x, S, kv)
        if cutoff is not None:  # eq. CP4: T <= cutoff implies T_int <= S * cutoff + W
            cp.add(obj <= math.floor(cutoff * S * kv) + math.ceil(W * kv))
        _time_cap(cp, lm, x, S, kv, W)
    except Unscalable as exc:  # (its times overflow the integers: an engine error, not a crash)
        return VariantResult("ERROR", stats={"vars": len(lm.names)}, message=str(exc))
    cp.minimize(obj)
    # CP-SAT 9.15 aborted ("Check failed: heuristics.fixed_search != nullptr") on a hinted model
    # with interleave_search (measured on a megatron-target instance); the incumbent still enters
    # every node model as the cut-off (eq. CP4), so the warm start keeps its value without the hint
    interleaved = INTERLEAVE and options.threads > 1 and not primal
    hinted = False if interleaved else _add_hint(cp, lm, x, S, lows, hint)
    build_s = time.perf_counter() - t0
    solver = _params(options, time_s - build_s, primal)
    if race is not None and race.interrupted:  # eq. N21: the other racer finished the node while this model was built
        return VariantResult("NO_SOLUTION", stats={"build_s": round(build_s, 4), "vars": len(lm.names)})
    with current().stopper(solver.stop_search), (race.stopper(solver.stop_search) if race else contextlib.nullcontext()):
        code = _solve_keeping_sigint(solver, cp)
    stats = {"build_s": round(build_s, 4), "vars": len(lm.names), "rows": len(lm.rows), "scale": S,
             "rounding_error_s": W / S, "tolerance_s": W / S, "hinted": int(hinted),
             "cp_status": solver.status_name(code), "branches": int(solver.num_branches)}
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        a = decode(lm, [solver.value(v) for v in x])
        bound = (solver.best_objective_bound - W * kv) / (S * kv)
        return VariantResult("OPTIMAL" if code == cp_model.OPTIMAL else "FEASIBLE", a, bound, stats)
    if code == cp_model.INFEASIBLE:
        return VariantResult("INFEASIBLE", stats=stats)
    if code == cp_model.MODEL_INVALID:
        return VariantResult("ERROR", stats=stats, message=f"CP-SAT model invalid: {cp.validate()}")
    return VariantResult("NO_SOLUTION", bound_s=(solver.best_objective_bound - W * kv) / (S * kv), stats=stats)
