"""Time vs cost (or energy): the epsilon-constraint sweep over eq. W1, and the cost / energy objectives.

Cost per iteration is T x R (eq. E2: time times the hourly rate of the GPUs used), bilinear in the plan, so it
is not given to a solver as an objective. Instead (formulations/README.md, eqs. F1-F3)::

    B_0 = the user's cap (or none);  step k: a_k = argmin T  s.t.  R <= B_k  (eq. W1),
    B_{k+1} = min(R(a_k) - 1, floor((1 - delta) R(a_k)))                                           (eq. F1)

Rates are integers (``economics.USD_UNIT`` / ``WATT_UNIT``). Every plan a with R(a) <= B_0 has a last step k
with R(a) <= B_k; then R(a) >= B_{k+1} + 1 and T(a) >= L_k (the step's proven bound), so
T(a) R(a) >= L_k (B_{k+1} + 1): min_k of that bounds the cost of every plan once the sweep has ended with an
infeasible step (eq. F2). With delta = 0 (the pareto command's ``--step 0``) B_{k+1} + 1 = R(a_k) and the
points are consecutive frontier points; delta > 0 skips rates within delta of the last one and costs at most
delta of the bound. Stopped earlier (``max_points``, a time bound, no plan in time), the plans
left have T >= L_K and R >= R_floor, which bounds them too (eq. F3). R_floor = max(min_o w_o, L min_o w_o / n_o)
with n_o the most layers option o can hold (eq. M2 with one micro-batch in flight and no embedding or head):
the stages' capacities must add up to L, the covering LP's bound. Energy
(eq. E4: E = T R_idle + D) sweeps the idle power R_idle the same way and adds eq. E6's lower bound of D (E6b:
over the options within the band's budget); the energy objective also solves each band once more on eq. E7's
problem (stage times inflated by their dynamic power), whose plan is a candidate and whose bound times R_lo
bounds the band's energy. The sweep does not prove energy optimal in general (the stated gap is what is
proven); ``band_search`` (eqs. EX1, W1b, EB1-EB5, at the end of this module) does, and answers ``--objective
cost|energy``, with a bound on T too (eqs. TX1e-TX3e). The sweep answers the pareto command and time under a cap.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from haap_milp import cost_dp, economics
from haap_milp.catalog.prices import PriceBook
from haap_milp.deadline import Deadline, current, use
from haap_milp.errors import HaapInputError
from haap_milp.planner import Context, Outcome, explain_infeasible, orchestrate
from haap_milp.problem import Budget, RawResult
from haap_milp.specs import Status

SECONDS_PER_HOUR = 3600.0
log = logging.getLogger(__name__)


@dataclass
class Point:
    """One step of the sweep: the plan found under ``limit`` (units of the measure; None: no budget row)."""

    outcome: Outcome
    limit: int | None
    rate: int  # the plan's eq. W1 left-hand side, in USD_UNIT or WATT_UNIT
    iteration_time_s: float
    bound_s: float | None  # proven lower bound of min T under this budget (None: none proven)
    value: float  # $ per iteration (cost) or J per iteration (energy), eq. E2 / E4 from the estimate
    lower: float | None  # eq. F2's term of this step: L_k (B_{k+1} + 1) (+ eq. E6 for energy; or eq. E7's if larger)


@dataclass
class Frontier:
    measure: str  # cost | energy
    points: list[Point] = field(default_factory=list)
    complete: bool = False  # the sweep ended with a proof that no cheaper plan exists
    stopped: str = ""  # why it ended
    lower_bound: float | None = None  # of the measure over every plan within the cap (eqs. F2, F3)
    candidates: list[Point] = field(default_factory=list)  # energy objective: eq. E7's plans (not frontier points)
    solves: int = 0  # band search: the bands solved (eq. EB4)
    dp_runs: int = 0  # band search: eq. CD4 shortest paths run (eq. CD5)
    search: str = "sweep"  # sweep (eqs. F1-F3) | band (eqs. EB1-EB5)
    # proven: no plan at any budget (the problem without eq. W1 is infeasible); the binding limit in words, as
    # ``planner.explain_infeasible`` gives it to the time objective ("" otherwise)
    infeasible: str = ""

    @property
    def pareto(self) -> list[Point]:
        """The non-dominated points (a point with a solver gap can be beaten by a later, cheaper one)."""
        out: list[Point] = []
        for p in sorted(self.points, key=lambda p: (p.iteration_time_s, p.rate)):
            if not out or p.rate < out[-1].rate:
                out.append(p)
        return out

    @property
    def best(self) -> Point | None:
        every = self.points + self.candidates
        return min(every, key=lambda p: p.value) if every else None

    @property
    def gap(self) -> float | None:
        b = self.best
        if b is None or self.lower_bound is None or b.value <= 0:
            return None
        return max(0.0, (b.value - self.lower_bound) / b.value)


def no_plan(ctx: Context, measure: str, search: str = "sweep") -> Frontier:
    """The frontier of a problem that presolve proved infeasible: empty, complete, with the binding limit in
    the words the time objective uses (``planner.explain_infeasible``)."""
    return Frontier(measure, complete=True, stopped="proven: no plan", search=search,
                    infeasible=explain_infeasible(ctx))


def _unit(measure: str) -> float:
    return economics.USD_UNIT / SECONDS_PER_HOUR if measure == "cost" else economics.WATT_UNIT


def check_prices(ctx: Context, book: PriceBook, measure: str) -> list[str]:
    """GPU types of the cluster in the search; a HaapInputError naming them when the book lacks a number."""
    types = [g.gpu_type for g in ctx.presolved.groups]
    gone = economics.missing(types, book, measure)
    if gone:
        what = f"{book.kind.replace('_', '-')} price" if measure == "cost" else "board power (tdp_w)"  # ("has no X")
        raise HaapInputError(f"--objective/pareto {measure}: {', '.join(gone)} has no {what} in the price book "
                             f"({book.source}); give it in a --prices FILE (haap-solve schema prices)",
                             field="--prices", value=gone)
    return types


def _with_budget(ctx: Context, weights: np.ndarray, limit: int | None, measure: str) -> Context:
    prob = ctx.presolved.problem
    if limit is None:
        return ctx
    b = economics.budget(prob, weights, limit, measure)
    return replace(ctx, presolved=replace(ctx.presolved, problem=replace(prob, budget=b,
                                                                         group_capacity=_capacity(prob, b))))


def _capacity(prob, b) -> tuple[int, ...]:
    """Eq. G1's capacities tightened by eq. W1: group g can give at most floor(B / least weight per GPU) GPUs
    (the same plans, stronger bounds for every solver)."""
    out = []
    for g, cap in enumerate(prob.group_capacity):
        per = [int(b.weight[i]) / o.num_gpus for i, o in enumerate(prob.options)
               if o.usage == ((g, o.num_gpus),)]  # single-group options: the group's weight per GPU
        low = min(per) if per else 0
        out.append(min(cap, int(b.limit // low)) if low > 0 else cap)
    return tuple(out)


def sweep(ctx: Context, book: PriceBook, measure: str, *, max_points: int = 8, cap: float | None = None,
          max_time_s: float | None = None, stop_when_bounded: bool = False, step: float = 0.0,
          deadline: Deadline | None = None) -> Frontier:
    """The epsilon-constraint sweep (module docstring). ``cap``: the first budget in $/h (cost) or idle W
    (energy); ``max_time_s``: the bound on T (--max-iteration-time, --min-tokens-per-s); ``stop_when_bounded``:
    stop once no further point can beat the best one (the cost / energy objective; the pareto command goes on
    to ``max_points``); ``step``: delta of eq. F1. ``deadline`` is shared by the points, each taking its share of what is left."""
    if measure not in economics.MEASURES:
        raise ValueError(measure)
    if not ctx.presolved.problem.variants:  # presolve proved it: no plan at any budget
        return no_plan(ctx, measure)
    types = check_prices(ctx, book, measure)
    prob = ctx.presolved.problem
    weights = economics.option_weights(prob, types, book, measure)
    unit = _unit(measure)
    energy = measure == "energy"
    refine = energy and stop_when_bounded  # the energy objective (not the pareto command's frontier)

    def d_lb_within(lim):  # eq. E6 (E6b under a budget): the least D of the plans whose rate is <= lim
        return economics.dynamic_energy_lb(prob, types, book, weights, lim) if energy else 0.0
    d_lb = d_lb_within(None)
    floor = rate_floor(prob, weights)
    limit = None if cap is None else math.floor(cap / (economics.USD_UNIT if measure == "cost"
                                                        else economics.WATT_UNIT) + 1e-9)
    fr = Frontier(measure)
    dl = deadline or current()
    last_bound: float | None = None
    pad = 0.0  # s: the most a solve has overrun its share
    for k in range(max_points):
        if limit is not None and limit < floor:
            fr.complete, fr.stopped = True, "no plan is cheaper than the cheapest single stage"
            break
        # a point's time, less what each solve has overrun its share so far (decode, estimate and checker of a
        # large plan run after the solver's limit: 0.3 s each on llama3-70b x hetero3-1024 under load)
        solves = 2 if refine else 1
        if fr.points and (dl.interrupted or (dl.limited and dl.remaining() - pad * solves < MIN_POINT_S)):
            fr.stopped = "interrupted" if dl.interrupted else "time limit reached"  # (a solve without time
            break  # still costs its heuristics)
        slot = max(dl.remaining() / (max_points - k) - pad * solves, MIN_POINT_S)
        share = dl.cap(slot * (1 - REFINE_SHARE if refine else 1)) if dl.limited else dl
        t0 = time.perf_counter()
        bctx = _with_budget(ctx, weights, limit, measure)
        hints = () if limit is None else _budget_hints(bctx, weights, limit, share)
        out = orchestrate(bctx, [(ctx.options.solver, None)], deadline=share, hints=hints).outcomes[0]
        if dl.limited:
            pad = max(pad, time.perf_counter() - t0 - slot * (1 - REFINE_SHARE if refine else 1))
        if _unproven_past(out, max_time_s) and dl.limited and dl.remaining() - pad > MIN_POINT_S:
            # the step's plan is past the T bound but its bound is not: the rest of the time on this one step
            # (it ends the sweep either way; a proof makes the sweep complete)
            found = out.result
            warm = RawResult("FEASIBLE", found.solver, assignment=out.raw_assignment, objective_s=found.objective_s)
            out = orchestrate(bctx, [(ctx.options.solver, None)], deadline=dl.cap(dl.remaining() - pad),
                              hints=(*hints, warm)).outcomes[0]
        r = out.result
        if r.status == Status.INFEASIBLE:
            fr.complete, fr.stopped = True, f"proven: no plan under the {'next' if k else 'first'} budget"
            if limit is None:  # no budget row yet: no plan at all, and finish() said why
                fr.stopped, fr.infeasible = "proven: no plan", r.message
            last_bound = None
            break
        if r.plan is None or out.raw_assignment is None or out.violations:
            fr.stopped = "interrupted" if dl.interrupted else f"no plan under the budget in time ({r.status.value})"
            last_bound = r.bound_s
            break
        rate = economics.rate_of(weights, [s.option for s in out.raw_assignment.stages])
        t_iter = float(out.estimate.iteration_time_s)
        econ = economics.plan_economics(r.plan, out.estimate, book)
        value = econ["usd_per_iteration"] if measure == "cost" else econ["joules_per_iteration"]
        nxt = min(rate - 1, math.floor((1 - step) * rate))  # B_{k+1}, eq. F1
        lower = None if r.bound_s is None else r.bound_s * (nxt + 1) * unit + d_lb_within(limit)
        # eq. E7: a D-aware plan of the band and a second bound of its energy (not at R_lo = 0, a GPU type idling at
        # 0 W: it bounds nothing there and would divide by it)
        if refine and (nxt + 1) * unit > 0 and (not dl.limited or REFINE_SHARE * slot >= MIN_POINT_S / 2):
            t0 = time.perf_counter()
            cand, term = _energy_refine(bctx, types, book, (nxt + 1) * unit, r.bound_s,
                                        dl.cap(REFINE_SHARE * slot) if dl.limited else dl)
            if dl.limited:
                pad = max(pad, time.perf_counter() - t0 - REFINE_SHARE * slot)
            if term is not None:
                lower = term if lower is None else max(lower, term)
            if cand is not None and (max_time_s is None or cand.iteration_time_s <= max_time_s):
                fr.candidates.append(cand)
        last_bound = r.bound_s
        if max_time_s is not None and t_iter > max_time_s:
            proven = r.bound_s is not None and r.bound_s > max_time_s
            fr.complete = proven
            fr.stopped = (f"the next plan takes {t_iter:.4g} s > the {max_time_s:.4g} s bound"
                          + ("" if proven else " (not proven optimal: within its gap)"))
            last_bound = None if proven else r.bound_s
            break
        fr.points.append(Point(out, limit, rate, t_iter, r.bound_s, value, lower))
        limit = nxt
        best = fr.best.value
        d_lb = d_lb_within(nxt)  # every plan left has a rate <= B_{k+1}
        if stop_when_bounded and r.bound_s is not None and r.bound_s * floor * unit + d_lb >= best:
            fr.complete, fr.stopped = True, "no plan left can beat the best one (eq. F3)"
            last_bound = None
            break
    else:
        fr.stopped = f"--max-points {max_points} reached"
    fr.lower_bound = _lower_bound(fr, last_bound, floor * unit, d_lb)
    return fr


REFINE_SHARE = 0.5  # energy objective: the share of a point's time for its eq. E7 solve
MIN_POINT_S = 2.0  # s: a sweep step given less is not started (measured: an orchestrate whose deadline has
# passed still takes 1.9-4.2 s on llama3-70b x hetero3-1024 under load: heuristics, decode, checker)


def _energy_refine(bctx: Context, types: list[str], book: PriceBook, r_lo_w: float, band_bound_s: float | None,
                   deadline: Deadline) -> tuple[Point | None, float | None]:
    """Eq. E7 on one band of the energy sweep (idle power in [R_lo, B_k], B_k the budget of ``bctx``): the
    least-T' plan under the same budget (a candidate whose energy is measured like every point's) and R_lo
    times the proven bound of min T', a lower bound of every band plan's energy (J)."""
    from haap_milp.planner import finish
    from haap_milp.problem import evaluate

    pre = bctx.presolved
    infl = economics.inflated_problem(pre.problem, types, book, r_lo_w)
    out = orchestrate(replace(bctx, presolved=replace(pre, problem=infl)), [(bctx.options.solver, None)],
                      deadline=deadline).outcomes[0]
    term = None if out.result.bound_s is None else r_lo_w * out.result.bound_s
    a = out.raw_assignment
    if a is None or out.violations:
        return None, term
    # the plan re-scored on the real problem; its time bound is the band's (the least T under the budget)
    raw = RawResult("FEASIBLE", f"{out.result.solver} (eq. E7)", assignment=a, objective_s=evaluate(pre.problem, a),
                    bound_s=band_bound_s, wall_time_s=out.result.wall_time_s)
    got = finish(bctx, raw)
    if got.result.plan is None or got.violations:
        return None, term
    weights = economics.option_weights(pre.problem, types, book, "energy")
    econ = economics.plan_economics(got.result.plan, got.estimate, book)
    point = Point(got, None, economics.rate_of(weights, [s.option for s in a.stages]),
                  float(got.estimate.iteration_time_s), band_bound_s, econ["joules_per_iteration"], None)
    return point, term


def _unproven_past(out: Outcome, max_time_s: float | None) -> bool:
    """A plan slower than the T bound whose proven bound does not exceed it (eq. F1's stop, not yet proven)."""
    r = out.result
    return (max_time_s is not None and out.estimate is not None and out.raw_assignment is not None
            and float(out.estimate.iteration_time_s) > max_time_s and (r.bound_s is None or r.bound_s <= max_time_s))


MAX_HINT_CAPS = 4  # capacity vectors whose DP plans seed a budgeted solve
HINT_SHARE = 0.25  # of a point's time for them


def _budget_hints(bctx: Context, weights: np.ndarray, limit: int, share: Deadline) -> tuple:
    """Warm starts for a budgeted solve: the DP heuristic (which ignores eq. W1) on whole-node capacity vectors
    whose every plan is within the budget and that cannot take one more node; the DP on the budgeted problem
    itself finds nothing when the cluster's fastest plan is over budget (measured: the 90 % budget of
    llama3-8b x h100-a100-32 then ended at a 16 % gap in 10 s). Only plans within eq. W1 are kept."""
    from haap_milp.planner import run_method
    from haap_milp.problem import violations

    pre = bctx.presolved
    prob = pre.problem
    per_gpu = [min((int(weights[i]) / o.num_gpus for i, o in enumerate(prob.options)
                    if o.usage == ((g, o.num_gpus),)), default=0.0) for g in range(len(prob.groups))]
    node = [max(grp.gpus_per_node, 1) for grp in pre.groups]
    n_max = [cap // nd for cap, nd in zip(prob.group_capacity, node)]
    vectors: list[tuple[int, ...]] = []

    def fill(g: int, chosen: list[int], spent: float) -> None:
        if len(vectors) > 20000:
            return
        if g == len(n_max):
            maximal = all(c == n or spent + node[i] * per_gpu[i] > limit for i, (c, n) in enumerate(zip(chosen, n_max)))
            if maximal and any(chosen):
                vectors.append(tuple(chosen))
            return
        most = min(n_max[g], int((limit - spent) // (node[g] * per_gpu[g]))) if per_gpu[g] > 0 else n_max[g]
        for c in (range(most, -1, -1) if g < len(n_max) - 1 else [most]):
            fill(g + 1, [*chosen, c], spent + c * node[g] * per_gpu[g])

    fill(0, [], 0.0)
    vectors.sort(key=lambda v: -sum(c * nd * w for c, nd, w in zip(v, node, per_gpu)))
    out = []
    hint_dl = share.cap(HINT_SHARE * share.remaining()) if share.limited else share
    for v in vectors[:MAX_HINT_CAPS]:
        if hint_dl.expired():
            break
        caps = tuple(c * nd for c, nd in zip(v, node))
        sub = replace(bctx, presolved=replace(pre, problem=replace(prob, group_capacity=caps, budget=None)))
        with use(hint_dl):
            raw, _ = run_method(sub, "dp")
        if raw.assignment is not None and not violations(prob, raw.assignment):
            out.append(raw)
    return tuple(out)


def rate_floor(problem, weights: np.ndarray) -> float:
    """R_floor of eq. F3: no plan of the problem has a smaller eq. W1 left-hand side."""
    from haap_milp.pipeline import memory_limit

    cap = np.zeros(problem.num_options)
    for v in problem.variants:
        room = memory_limit(v.mem_capacity) - v.fixed_mem
        n = np.floor(room / np.maximum(v.layer_static_mem + v.layer_act_mem, 1.0))
        cap = np.maximum(cap, np.where(np.asarray(v.allowed, bool), np.minimum(n, problem.num_layers), 0))
    ok = cap >= 1
    if not ok.any():
        return 0.0
    w = weights[ok].astype(float)
    return float(max(w.min(), problem.num_layers * (w / cap[ok]).min()))


def _lower_bound(fr: Frontier, last_bound: float | None, floor_rate: float, d_lb: float) -> float | None:
    """Eqs. F2, F3: the least cost (energy) any plan within the cap can have; None when a step proved nothing."""
    terms = [p.lower for p in fr.points]
    if any(t is None for t in terms):
        return None
    if not fr.complete:
        if last_bound is None and fr.points:
            last_bound = fr.points[-1].bound_s
        if last_bound is None:
            return None
        terms.append(last_bound * floor_rate + d_lb)
    return min(terms) if terms else None


def time_bound(max_iteration_time_s: float | None, min_tokens_per_s: float | None, tokens_per_iteration: int):
    """The bound on T from --max-iteration-time and --min-tokens-per-s (the tighter one; None: none)."""
    bounds = [b for b in (max_iteration_time_s,
                          None if not min_tokens_per_s else tokens_per_iteration / min_tokens_per_s) if b is not None]
    return min(bounds) if bounds else None


def point_document(p: Point, book: PriceBook) -> dict:
    """One frontier point as JSON: the time, its proof, cost and energy (eqs. E1-E5), GPUs per type, the plan."""
    r, e = p.outcome.result, p.outcome.estimate
    gpus = economics.gpus_by_type(r.plan)
    econ = economics.plan_economics(r.plan, e, book)
    return {"iteration_time_s": p.iteration_time_s, "bound_s": p.bound_s, "gap": r.gap,
            "tokens_per_s": e.tokens_per_s, **{k: v for k, v in econ.items() if k != "price_kind"},
            "gpus": gpus, "status": r.status.value, "plan": r.plan.model_dump(mode="json")}


# --- The exact band search of the cost and energy objectives (eqs. EB1-EB4) ------------------------------------

BAND_MIN_S = 0.5  # s: the least time a band's solve is given under a deadline (doubled on each retry)


@dataclass
class _Band:
    """Rates [lo, hi] (integer units of eq. W1, undivided) and the band's proven lower bound of the measure."""

    lower: float
    lo: int
    hi: int
    tries: int = 0
    dp_done: bool = False  # eq. CD5 has bounded the band

    def __lt__(self, other):
        return (self.lower, -self.hi) < (other.lower, -other.hi)


def _rate_terms(prob, types: list[str], book: PriceBook, measure: str):
    """Per option: R_true (W of idle power, or $ per s) and rho (W of dynamic power; zeros for cost)."""
    if measure == "cost":
        per = np.array([book.usd_per_gpu_hour(k) / SECONDS_PER_HOUR for k in types])
        rho = np.zeros(prob.num_options)
    else:
        per = np.array([book.idle_w(k) for k in types])
        rho = economics.dynamic_rate(prob, types, book)
    r_true = np.array([sum(n * per[g] for g, n in o.usage) for o in prob.options], float)
    return r_true, rho


def _kappa(types: list[str], book: PriceBook, measure: str) -> float:
    """Eq. EB2: R_true >= kappa U R_units for every plan (U the unit of W1: the per-GPU rounding of the weights)."""
    unit = economics.USD_UNIT / SECONDS_PER_HOUR if measure == "cost" else economics.WATT_UNIT
    ks = []
    for k in types:
        true = book.usd_per_gpu_hour(k) / SECONDS_PER_HOUR if measure == "cost" else book.idle_w(k)
        rounded = round(true / unit) * unit
        if rounded > 0:
            ks.append(true / rounded)
    return min(min(ks, default=1.0), 1.0)


def plan_value(prob, a, r_true: np.ndarray, rho: np.ndarray) -> float:
    """The measure of an assignment on the Problem: T R_true (cost, $) or T R_idle + M sum_j rho_j t_j (J,
    eq. E4)."""
    from haap_milp.problem import evaluate, stage_times

    t = evaluate(prob, a)
    r = float(sum(r_true[s.option] for s in a.stages))
    m = prob.variants[a.variant].num_microbatches
    d = m * float(sum(rho[s.option] * tj for s, tj in zip(a.stages, stage_times(prob, a))))
    return t * r + d


def band_problem(prob, weights: np.ndarray, rho: np.ndarray, lo: int, hi: int, t_lo: float, r_lo: float):
    """Eq. EB1: the Problem of the band [lo, hi]: eq. W1 with its floor (W1b), G1 tightened, and the extra
    objective terms of eq. EX1 that make its objective f = T + (T_lo/lo)(R - lo) + D / r_lo, so that every plan
    of the band has E >= r_lo f (eq. EB3; r_lo = kappa U lo, T_lo a lower bound of T over every plan)."""
    from haap_milp.problem import Budget, ExtraObjective

    g = int(np.gcd.reduce(weights[weights > 0])) if (weights > 0).any() else 1
    b = Budget(weights // g, hi // g, name="rate band", lower=-(-lo // g))
    per_stage = t_lo / lo * weights.astype(float) if lo > 0 else np.zeros(len(weights))
    variants = []
    for v in prob.variants:
        c = v.num_microbatches * rho / r_lo if r_lo > 0 else np.zeros(len(rho))
        x = ExtraObjective(per_stage, c * v.layer_time, c * v.first_time, c * v.last_time,
                           -t_lo if lo > 0 else 0.0)
        variants.append(replace(v, extra=x))
    return replace(prob, budget=b, group_capacity=_capacity(prob, b), variants=tuple(variants))


def band_search(ctx: Context, book: PriceBook, measure: str, *, cap: float | None = None,
                max_time_s: float | None = None, deadline: Deadline | None = None) -> Frontier:
    """The cost or energy optimum, proven within the solver's relative gap (eqs. EB1-EB5): best-first branch and
    bound over bands of the rate R (idle W or $/h, W1's integer units). A band's cheap bound (eq. EB5) orders
    the search; its solve minimises the linear objective of eq. EB1 on the exact solver, whose bound times r_lo
    bounds the band's measure (eq. EB3); a band is split at its plan's rate (or, unfinished, at its geometric
    middle) until it is pruned (eq. EB4). ``cap``: the largest rate ($/h or W). ``max_time_s``: T_max of eq.
    TX1e (--max-iteration-time, --min-tokens-per-s), a row of every band's solve, a prune of every band whose
    time bound exceeds it (eq. TX3e) and a filter on every plan kept. Points: the plans found. A price book with
    a GPU type of price (idle power) 0 has plans of rate 0, which no band covers: the sweep answers."""
    import heapq

    from haap_milp.planner import finish, run_method
    from haap_milp.problem import RawResult, evaluate, violations

    if measure not in economics.MEASURES:
        raise ValueError(measure)
    if not ctx.presolved.problem.variants:  # presolve proved it: no plan at any budget
        return no_plan(ctx, measure, "band")
    types = check_prices(ctx, book, measure)
    prob = ctx.presolved.problem
    weights = economics.option_weights(prob, types, book, measure)
    if (weights <= 0).any():  # a free (or zero-idle) GPU type: plans of rate 0 lie below every band (r_lo = 0)
        return sweep(ctx, book, measure, cap=cap, max_time_s=max_time_s, stop_when_bounded=True, deadline=deadline)
    tprob = replace(prob, max_time_s=max_time_s)  # eq. TX1e on every plan kept and every band's problem
    r_true, rho = _rate_terms(prob, types, book, measure)
    unit_w = economics.USD_UNIT / SECONDS_PER_HOUR if measure == "cost" else economics.WATT_UNIT
    kappa = _kappa(types, book, measure)
    gap = ctx.options.relative_gap
    t_start = time.perf_counter()
    dl = deadline or current()
    fr = Frontier(measure, search="band")
    per_gpu = [round((book.usd_per_gpu_hour(k) / economics.USD_UNIT) if measure == "cost"
                     else book.idle_w(k) / economics.WATT_UNIT) for k in types]
    top = int(sum(c * w for c, w in zip(prob.group_capacity, per_gpu)))
    if cap is not None:
        top = min(top, math.floor(cap / (economics.USD_UNIT if measure == "cost" else economics.WATT_UNIT) + 1e-9))
    bottom = max(1, math.ceil(rate_floor(prob, weights) - 1e-9))

    # the time optimum first (within the cap, without T_max): a candidate, a warm start, and a lower bound of T over
    # every plan; past T_max it proves that no plan meets the bound (eq. TX3e)
    first_dl = dl.cap(dl.remaining() * FIRST_SHARE) if dl.limited else dl
    base = _with_budget(ctx, weights, top if cap is not None else None, measure)
    out = orchestrate(base, [(ctx.options.solver, None)], deadline=first_dl).outcomes[0]
    t_all = max(out.result.bound_s or 0.0, 0.0 if cap is not None else ctx.presolved.lower_bound_s or 0.0)
    found: dict = {}  # assignment -> its measure on the Problem

    def offer(a):
        if a is not None and a not in found and not violations(tprob, a) and \
                (cap is None or economics.rate_of(weights, [s.option for s in a.stages]) <= top):
            found[a] = plan_value(prob, a, r_true, rho)
    offer(out.raw_assignment)
    if out.result.status == Status.INFEASIBLE:
        fr.complete, fr.stopped = True, "proven: no plan"
        if cap is None:  # infeasible without eq. W1: no plan at all, and finish() said why
            fr.infeasible = out.result.message
        return fr
    if max_time_s is not None and t_all > max_time_s * (1 + 1e-9):
        fr.complete, fr.stopped = True, too_slow(t_all, max_time_s, out)
        return fr
    t_floor = _TimeFloor(prob, weights, t_all)
    closed: list[float] = []
    heap: list[_Band] = []
    # eq. CD5: the stage-additive bound of every plan within the cap (rate >= the floor), and its paths as plans
    cdps = cost_dp.variant_dps(prob, r_true, rho)
    paid = weights > 0
    kappa_hi = float((r_true[paid] / (unit_w * weights[paid])).max()) if paid.any() else 1.0  # R_true <= kappa_hi U R
    best = min(found.values(), default=math.inf)
    whole = cost_dp.cost_bound(cdps, best * (1 - gap), r_lo=kappa * unit_w * bottom, usable=weights <= top,
                               r_hi=kappa_hi * unit_w * top,
                               deadline=dl.cap(dl.remaining() * CD_SHARE) if dl.limited else None)
    for a in whole.plans:
        offer(a)
    fr.dp_runs = whole.dps
    log.debug("eq. CD5 over every plan: %.6g (%d runs, %s), %.2f s left", whole.value, whole.dps,
              "complete" if whole.complete else "stopped", dl.remaining() if dl.limited else -1)

    def cheap(lo: int, hi: int) -> float:
        # eq. EB5: R >= kappa U lo, T >= the budget-hi bound of T, D >= eq. E6b's bound
        d_lb = economics.dynamic_energy_lb(prob, types, book, weights, hi) if measure == "energy" else 0.0
        return kappa * unit_w * lo * t_floor(hi) + d_lb

    def push(lo: int, hi: int, lower: float = 0.0, tries: int = 0) -> None:
        # eq. EB5's bound waits for the band's turn (its T_lo takes eq. B2 on every variant: 1 s for 20 bands x 53
        # variants), unless T_max needs it now (eq. TX3e); eq. CD5 over every plan bounds every band at once
        if max_time_s is not None and t_floor(hi) > max_time_s * (1 + 1e-9):  # eq. TX3e: no plan fast enough
            closed.append(math.inf)
            return
        heapq.heappush(heap, _Band(max(lower, whole.value), lo, hi, tries))

    for lo, hi in _geometric(bottom, top, BAND_CD_START):
        push(lo, hi)
    tol = 0.0
    while heap:
        best = min(found.values(), default=math.inf)
        b = heap[0]
        if b.lower + tol >= best * (1 - gap) - 1e-9 * best:
            break  # every open band is pruned
        if dl.interrupted or (dl.limited and dl.remaining() < BAND_MIN_S + FINISH_S):
            fr.stopped = "interrupted" if dl.interrupted else "time limit reached"
            break
        heapq.heappop(heap)
        if not b.dp_done:  # eq. CD5 on the band: its rate floor in form 0, only options within its top
            got = cost_dp.cost_bound(cdps, best * (1 - gap), r_lo=kappa * unit_w * b.lo, usable=weights <= b.hi,
                                     r_hi=kappa_hi * unit_w * b.hi, max_ratio=BAND_CD_RATIO,
                                     deadline=dl.cap(dl.remaining() - FINISH_S) if dl.limited else None,
                                     floors=whole.floors)
            fr.dp_runs += got.dps
            for a in got.plans:
                offer(a)
            b.dp_done, b.lower = True, max(b.lower, got.value)
            best = min(found.values(), default=math.inf)
            if b.lower < best * (1 - gap) and b.hi > b.lo * BAND_RATIO:  # wide and not pruned: eq. CD5 on halves
                mid = max(b.lo, min(b.hi - 1, int(math.sqrt(b.lo * b.hi))))
                log.debug("band [%d, %d] eq. CD5 %.6g (%d runs): split at %d", b.lo, b.hi, got.value, got.dps, mid)
                push(b.lo, mid, b.lower, b.tries)
                push(mid + 1, b.hi, b.lower, b.tries)
                continue
            if b.lower < best * (1 - gap) and not (dl.limited and dl.remaining() < BAND_MIN_S + FINISH_S):
                b.lower = max(b.lower, cheap(b.lo, b.hi))  # not pruned: eq. EB5's bound too (its T_lo is needed to solve)
            log.debug("band [%d, %d] eq. CD5 %.6g (%d runs), lower %.6g", b.lo, b.hi, got.value, got.dps, b.lower)
            heapq.heappush(heap, b)  # back in best-first order (pruned at the top of the loop when it reaches best)
            continue
        r_lo = kappa * unit_w * b.lo
        t_lo = t_floor(b.hi)
        bprob = band_problem(tprob, weights, rho, b.lo, b.hi, t_lo, r_lo)
        bctx = replace(ctx, presolved=replace(ctx.presolved, problem=bprob))
        share = None
        if dl.limited:
            share = min(dl.remaining(), max(BAND_MIN_S * 2 ** min(b.tries, 10),
                                            dl.remaining() / min(len(heap) + 1, BAND_FOCUS)))
            bctx = replace(bctx, options=ctx.options.model_copy(update={"time_limit_s": share}))
        fits = [a for a in found if not violations(bprob, a)]
        if not fits and dl.limited and b.lo > bottom:  # DP plans on whole-node capacities within the band's top (eq. W1)
            for r in _budget_hints(bctx, weights, b.hi, dl.cap(share) if share is not None else dl):
                offer(r.assignment)
                if not violations(bprob, r.assignment):
                    fits.append(r.assignment)
        hint = None
        if fits:
            a0 = min(fits, key=lambda a: evaluate(bprob, a))
            hint = RawResult("FEASIBLE", "band", assignment=a0, objective_s=evaluate(bprob, a0))
        with use(dl.cap(share) if share is not None else dl):
            raw, _ = run_method(bctx, ctx.options.solver, hint)
        fr.solves += 1
        if raw.status == "INFEASIBLE":
            closed.append(math.inf)
            continue
        a = raw.assignment
        offer(a)
        lower = b.lower
        if raw.bound_s is not None:
            lower = max(lower, r_lo * raw.bound_s)
            tol = max(tol, r_lo * float(raw.stats.get("tolerance_s", 0.0)))
        best = min(found.values(), default=math.inf)
        rate = None if a is None else economics.rate_of(weights, [s.option for s in a.stages])
        log.debug("band [%d, %d] %s bound %s lower %.6g best %.6g plan rate %s (%.2f s left)", b.lo, b.hi,
                  raw.status, raw.bound_s, lower, best, rate, dl.remaining() if dl.limited else -1)
        if lower + tol >= best * (1 - gap) - 1e-9 * best:
            closed.append(lower)
        elif raw.status == "OPTIMAL" and rate is not None and b.lo < rate <= b.hi:  # eq. EB4: at the plan's rate
            push(b.lo, rate - 1, lower)
            push(rate, b.hi, lower)
        elif raw.status == "OPTIMAL" or b.tries >= MAX_BAND_TRIES:  # the plan is at the band's floor (or a
            closed.append(lower)  # one-rate band that its solves do not finish): the band's bound is proven
        elif b.lo < b.hi:  # unfinished: two narrower bands (tighter r_lo and T_lo)
            mid = max(b.lo, min(b.hi - 1, int(math.sqrt(b.lo * b.hi))))
            push(b.lo, mid, lower, b.tries + 1)
            push(mid + 1, b.hi, lower, b.tries + 1)
        else:
            push(b.lo, b.hi, lower, b.tries + 1)
    best_a = min(found, key=found.get) if found else None
    if not fr.stopped:
        fr.complete = True
        fr.stopped = "proven within the gap (eq. EB4)" if best_a is not None else \
            f"proven: no plan within the {max_time_s:.4g} s bound (eq. TX3e: every band infeasible or too slow; " \
            f"the fastest plan takes at least {t_all:.4g} s)" if max_time_s is not None else "proven: no plan"
    lows = closed + [x.lower for x in heap]
    if best_a is not None:
        lows.append(found[best_a])
    fr.lower_bound = min(lows, default=None)
    if fr.lower_bound is not None and not math.isfinite(fr.lower_bound):
        fr.lower_bound = None
    proof = best_a is not None and fr.complete and fr.lower_bound is not None and \
        found[best_a] - fr.lower_bound <= gap * found[best_a] + tol + 1e-9 * found[best_a]
    # the plans found, each decoded and priced like a frontier point; the best is OPTIMAL when the search proved
    # it (for the measure: a plan's time bound means nothing here, so none is given)
    for a in sorted(found, key=found.get)[:MAX_BAND_POINTS]:
        proven = proof and a == best_a
        raw = RawResult("OPTIMAL" if proven else "FEASIBLE", f"{ctx.options.solver} (band search, eq. EB4)",
                        assignment=a, objective_s=evaluate(prob, a), wall_time_s=time.perf_counter() - t_start,
                        message="" if proven else "not proven: see the objective's gap")
        got = finish(ctx, raw)
        if got.result.plan is None or got.violations:
            continue
        econ = economics.plan_economics(got.result.plan, got.estimate, book)
        value = econ["usd_per_iteration"] if measure == "cost" else econ["joules_per_iteration"]
        fr.points.append(Point(got, None, economics.rate_of(weights, [s.option for s in a.stages]),
                               float(got.estimate.iteration_time_s), got.result.bound_s, value, None))
    fr.points.sort(key=lambda p: p.rate, reverse=True)
    return fr


def too_slow(t_bound: float, max_time_s: float, out: Outcome) -> str:
    """Eq. TX3e's proof, in words: the least T of any plan exceeds T_max."""
    e = out.estimate
    fastest = "" if e is None else f" (the fastest plan found: {float(e.iteration_time_s):.4g} s)"
    return (f"proven: no plan within the {max_time_s:.4g} s bound (--max-iteration-time / --min-tokens-per-s): "
            f"every plan takes at least {t_bound:.4g} s per iteration{fastest}")


class _TimeFloor:
    """Eq. EB5's T_lo(hi): a lower bound of T over the plans with rate <= hi, the least of eq. B2's variant bounds
    on the problem with eq. W1 at hi (eq. C2 lifts them: fewer affordable GPUs, a longer period), and never
    below ``t_all`` (a bound over every plan). Memoised per hi."""

    def __init__(self, prob, weights: np.ndarray, t_all: float):
        self.prob, self.weights, self.t_all, self.memo = prob, weights, t_all, {}

    def __call__(self, hi: int) -> float:
        from haap_milp.solvers.common.bounds import variant_bound
        from haap_milp.solvers.common.slot_bounds import build_tables

        if hi not in self.memo:
            g = int(np.gcd.reduce(self.weights[self.weights > 0])) if (self.weights > 0).any() else 1
            b = Budget(self.weights // g, hi // g, name="rate")
            p = replace(self.prob, budget=b, group_capacity=_capacity(self.prob, b))
            vals = [variant_bound(p, build_tables(p, v)).total_s for v in range(len(p.variants))]
            best = min(vals, default=math.inf)
            self.memo[hi] = max(self.t_all, best)  # inf: no plan within hi
        return self.memo[hi]


def _geometric(lo: int, hi: int, ratio: float) -> list[tuple[int, int]]:
    """[lo, hi] cut into bands whose top is at most ``ratio`` times their floor."""
    out = []
    while lo <= hi:
        top = min(hi, max(lo, math.floor(lo * ratio)))
        out.append((lo, top))
        lo = top + 1
    return out


BAND_RATIO = 1.25  # a band this narrow (top / floor) that eq. CD5 does not prune is solved; a wider one is halved
BAND_CD_START = 2.0  # the initial bands' top / floor (eq. CD5 prunes most of them whole)
CD_SHARE = 0.3  # of the time left after the time optimum, at most, for eq. CD5 over every plan
BAND_CD_RATIO = cost_dp.MAX_RATIO  # eq. CD5's narrowest period interval on a band, as over the whole problem
BAND_FOCUS = 3  # a band's solve gets at least 1/BAND_FOCUS of the time left (best first)
FIRST_SHARE = 0.15  # of the deadline for the time optimum that starts the band search
MAX_BAND_POINTS = 8  # plans of the band search kept as points
FINISH_S = 0.5  # s left at the end of a band search with a deadline to decode, estimate and check its points
MAX_BAND_TRIES = 8  # a one-rate band whose solves end unfinished this often is closed with its proven bound
