"""Re-planning after GPUs are lost or added (formulations/README.md, eqs. MG1-MG3).

Given a plan and the cluster as it is now:

* **new plan**: the time optimum on the new cluster (``planner``);
* **degraded plan** (eq. MG3): the old plan minus the lost GPUs — in every (GPU type, island) that now has
  fewer GPUs than the plan uses, stages give up data-parallel replicas (largest dp first, each to the next
  smaller dp dividing the samples per micro-batch, B kept) until the group fits; it must then pass
  ``check_plan`` (memory included) on the new cluster, else there is no degraded plan and the job must move;
* **migration** (eqs. MG1, MG2): each decoder layer whose (GPU type, island, tp, dp) changes moves its whole
  state once — weights and optimizer state, P_l x (w + o) bytes (``estimator.memory.param_bytes``: bf16
  2 + 12 for Adam); gradients are recomputed, not moved. The bytes of each (old group -> new group) pair go
  over that pair's link at the estimator's p2p price (``Estimator.round_trip_s`` / 2, streams = the fewer
  GPUs of the two sides, measured networks included), the pairs one after another (no overlap assumed: an
  upper estimate). Money: the migration time at the new plan's hourly rate (eq. E1). Layers whose old
  group has no GPU left cannot be moved from live GPUs (``from_checkpoint``; not priced);
* **payback** (eq. MG3): staying at T_deg vs pausing m s and running at T_new, equal after
  t* = m T_deg / (T_deg - T_new) seconds of wall time (never, when T_new >= T_deg);
* ``max_migration_s``: candidates whose migration takes longer are refused; the candidates are the new
  optimum and the degraded plan (a migration-aware search is not implemented);
* time: the new cluster is presolved once, the degraded plan (``encode``d into the new problem) warm-starts
  the solve beside the DP heuristic, and the solve gets ``SOLVE_SHARE`` of the deadline left after presolve.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from haap_milp import economics, planner
from haap_milp.catalog.prices import PriceBook
from haap_milp.check import check_plan
from haap_milp.deadline import Deadline, current, use
from haap_milp.estimator import Estimator
from haap_milp.estimator.memory import param_bytes
from haap_milp.problem import Assignment, RawResult, Stage, evaluate, violations
from haap_milp.specs import ClusterSpec, ModelSpec, Plan, SolveOptions, TrainingSpec


@dataclass
class Migration:
    bytes_moved: float = 0.0
    time_s: float = 0.0
    usd: float | None = None
    pairs: list[dict] = field(default_factory=list)  # {"from", "to", "bytes", "time_s"}
    from_checkpoint: list[int] = field(default_factory=list)  # layers whose old group has no GPU left


@dataclass
class Replan:
    new: planner.Outcome
    degraded: Plan | None
    degraded_time_s: float | None
    migration: Migration | None
    payback_s: float | None
    choice: str  # "migrate" | "stay" (degraded) | "none"
    note: str = ""


def _groups(cluster: ClusterSpec) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for ng in cluster.node_groups:
        out[(ng.gpu.name, ng.island)] = out.get((ng.gpu.name, ng.island), 0) + ng.num_gpus
    return out


def degrade(plan: Plan, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
            est: Estimator) -> Plan | None:
    """Eq. MG3's degraded plan (module docstring), or None when it cannot run on ``cluster``. A plan with a
    mixed stage (eq. H1) is kept only if it still runs unchanged (shrinking a mixed stage would re-split
    its micro-batch: left to the new solve)."""
    if plan.has_mixed_stage:
        return None if check_plan(plan, model, cluster, training, estimator=est) else plan
    caps = _groups(cluster)
    b = plan.samples_per_microbatch
    dps = [s.dp for s in plan.stages]
    for key in {(s.gpu_type, s.island) for s in plan.stages}:
        idx = [j for j, s in enumerate(plan.stages) if (s.gpu_type, s.island) == key]
        while sum(plan.stages[j].tp * dps[j] for j in idx) * plan.cp > caps.get(key, 0):
            j = max(idx, key=lambda j: (dps[j], -j))
            smaller = [d for d in range(dps[j] - 1, 0, -1) if b % d == 0]
            if not smaller:
                return None
            dps[j] = smaller[0]
    stages = tuple(s.model_copy(update={"dp": d, "time_s": None, "memory_gib": None}) for s, d in zip(plan.stages, dps))
    new = plan.model_copy(update={"stages": stages, "micro_batch_size": b // dps[0], "cluster": cluster.name})
    return None if check_plan(new, model, cluster, training, estimator=est) else new


def _placement(plan: Plan) -> list[tuple]:
    """Per decoder layer: (GPU type, island, tp, dp, GPUs of its stage). A mixed stage (eq. H1) is described by
    its first replica type; its other types' copies of the layer are priced as if on that type's links."""
    out = []
    for s in plan.stages:
        out += [(s.gpu_type, s.island, s.tp, s.dp, s.num_gpus * plan.cp)] * s.num_layers
    return out


def migration(old: Plan, new: Plan, model: ModelSpec, training: TrainingSpec, est: Estimator,
              usd_per_hour: float | None) -> Migration:
    """Eqs. MG1, MG2 (module docstring): bytes, seconds and dollars to move from ``old`` to ``new``."""
    pb = param_bytes(training.precision, 0, 1, training.optimizer_state_bytes_per_param)
    per_param = pb.weights + pb.optimizer  # whole-layer state, moved once (eq. MG1)
    live = _groups(est.cluster)
    pairs: dict[tuple, list[float]] = {}
    mig = Migration()
    for layer, (a, b) in enumerate(zip(_placement(old), _placement(new))):
        if a[:4] == b[:4]:
            continue
        nbytes = model.layer_params(layer) * per_param
        if live.get(a[:2], 0) == 0:
            mig.from_checkpoint.append(layer)
            continue
        acc = pairs.setdefault((a[:2], b[:2]), [0.0, math.inf])
        acc[0] += nbytes
        acc[1] = min(acc[1], a[4], b[4], live[a[:2]])
    for (src, dst), (nbytes, streams) in sorted(pairs.items()):
        t = est.round_trip_s(src, dst, nbytes, max(int(streams), 1)) / 2  # one way (eq. MG2)
        mig.pairs.append({"from": "@".join(src), "to": "@".join(dst), "bytes": nbytes, "time_s": t})
        mig.bytes_moved += nbytes
        mig.time_s += t
    mig.usd = None if usd_per_hour is None else mig.time_s * usd_per_hour / 3600.0
    return mig


def payback_s(t_new: float, t_degraded: float | None, migration_s: float) -> float | None:
    """Eq. MG3: wall seconds after which migrating has done more iterations than staying (0: must migrate)."""
    if t_degraded is None:
        return 0.0
    if t_new >= t_degraded:
        return None
    return migration_s * t_degraded / (t_degraded - t_new)


DEFAULT_TIME_LIMIT_S = 8.0  # `replan --time-limit`: with the CLI's start-up (1.3-1.9 s measured under load) within
# issue 16's 10 s
SETUP_FACTOR = 1.5  # the exact search is skipped when its share is under this many times presolve's wall time:
# measured (llama3-70b x hetero3-1024 after losing an H100 node, load 5.7-6.3 on 2 cores): presolve 2.4 s, the
# search given 2.2 s did 0 nodes, returned the warm start and ended 0.7-1.0 s late (the whole command 10.2-12.4 s)
SOLVE_SHARE = 0.85  # of the deadline left after presolve: the new solve's share; the rest is for the degraded
# plan's check, the migration and the report (measured 0.01-0.05 s each for llama3-70b on hetero3-1024)


def encode(pre, plan: Plan) -> Assignment | None:
    """``plan`` as an Assignment of the presolved problem (the inverse of ``presolve.decode``), or None when
    one of its stages (or its micro-batch size) is no option/variant of the problem. Single-type stages only."""
    prob = pre.problem
    if plan.has_mixed_stage:
        return None
    b = plan.samples_per_microbatch
    labels = {g.label: i for i, g in enumerate(pre.groups)}
    index = {(o.group, o.tp, o.dp, o.ep, o.recompute): i for i, o in enumerate(prob.options) if not o.mix}
    for v, var in enumerate(prob.variants):
        if var.samples_per_microbatch != b or var.num_microbatches != plan.num_microbatches:
            continue
        stages = []
        for s in plan.stages:
            o = index.get((labels.get(f"{s.gpu_type}@{s.island}"), s.tp, s.dp, s.ep, s.recompute))
            if o is None or not var.allowed[o]:
                return None
            stages.append(Stage(o, s.num_layers))
        return Assignment(v, tuple(stages))
    return None


def _warm_start(ctx: planner.Context, plans) -> tuple[RawResult, ...]:
    """The old plan or its degraded form as warm starts of the new solve, where they are plans of its problem
    (eqs. G1, M1, M2 checked by ``problem.violations``): the solver starts from a feasible plan at once. Each
    also with its layers re-balanced over the same stages (``rebalance``, eq. MG4): a stage that lost replicas
    is slower, and moving layers off it recovers most of the loss in milliseconds (measured on llama3-70b x
    hetero3-1024 less one H100 node: 15.17 s degraded, 8.91 s re-balanced; the DP heuristic needs 2-3 s there
    and, cut short by the CLI's deadline under load, had returned 15.47 s)."""
    prob = ctx.presolved.problem
    out = []
    for p in plans:
        a = None if p is None else encode(ctx.presolved, p)
        if a is not None and not violations(prob, a):
            out.append(RawResult("FEASIBLE", "degraded", assignment=a, objective_s=evaluate(prob, a)))
            b = rebalance(prob, a)
            if b is not None and b != a and not violations(prob, b):
                out.append(RawResult("FEASIBLE", "degraded, re-balanced", assignment=b, objective_s=evaluate(prob, b)))
    return tuple(out)


def rebalance(prob, a: Assignment) -> Assignment | None:
    """Eq. MG4: the same stages (options, order, variant) with the layer counts that minimise the slowest stage
    time max_j t_j (eq. T1a) within each stage's memory (eq. M2): the least candidate tau whose per-stage layer
    caps min(U_j, floor((tau - e_j) / lambda_j)) reach L, then layers taken off the last stages until they sum
    to L (which never raises a stage time). None when no split fits."""
    from haap_milp.pipeline import fits_memory
    from haap_milp.problem import stage_memory

    var = prob.variants[a.variant]
    p, big = len(a.stages), prob.num_layers
    lam = [float(var.layer_time[s.option]) for s in a.stages]
    extra = [float((var.first_time[s.option] if j == 0 else 0.0) + (var.last_time[s.option] if j == p - 1 else 0.0))
             for j, s in enumerate(a.stages)]
    caps = []
    for j, st in enumerate(a.stages):  # U_j: the most layers stage j holds at its position (eq. M2)
        n_ok = 0
        for n in range(1, big - p + 2):
            trial = Assignment(a.variant, tuple(Stage(s.option, n if i == j else 1) for i, s in enumerate(a.stages)))
            if not fits_memory(stage_memory(prob, trial)[j], var.mem_capacity[st.option]):
                break
            n_ok = n
        if n_ok < 1:
            return None
        caps.append(n_ok)
    if sum(caps) < big:
        return None

    def layers(tau: float) -> list[int]:
        return [min(u, math.floor((tau - e) / lm + 1e-9) if lm > 0 else u) for u, e, lm in zip(caps, extra, lam)]
    cands = sorted({n * lm + e for lm, e, u in zip(lam, extra, caps) for n in range(1, u + 1)})
    lo, hi = 0, len(cands) - 1
    while lo < hi:  # the least candidate tau whose caps reach L (monotone in tau)
        mid = (lo + hi) // 2
        ns = layers(cands[mid])
        if min(ns) >= 1 and sum(ns) >= big:
            hi = mid
        else:
            lo = mid + 1
    ns = layers(cands[lo])
    if min(ns) < 1 or sum(ns) < big:
        return None
    over = sum(ns) - big
    for j in reversed(range(p)):  # drop the surplus (stage times only fall)
        take = min(over, ns[j] - 1)
        ns[j] -= take
        over -= take
    return Assignment(a.variant, tuple(Stage(s.option, n) for s, n in zip(a.stages, ns)))


def replan(plan: Plan, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, options: SolveOptions,
           book: PriceBook, max_migration_s: float | None = None, deadline: Deadline | None = None) -> Replan:
    """The new optimum, the degraded plan, the migration between them and the payback (module docstring).
    The new solve is warm-started from the degraded plan and gets ``SOLVE_SHARE`` of the time left after
    presolve, so the whole re-plan ends within ``deadline`` with a plan and its migration priced."""
    dl = deadline or current()
    t0 = time.perf_counter()
    with use(dl):
        ctx = planner.Context.build(model, cluster, training, options)
    presolve_s = time.perf_counter() - t0
    est = ctx.estimator
    deg = degrade(plan, model, cluster, training, est)
    t_deg = est.estimate(deg).iteration_time_s if deg is not None else None
    solve_dl = dl.cap(SOLVE_SHARE * dl.remaining()) if dl.limited else dl
    hints = _warm_start(ctx, (deg,))
    if hints and solve_dl.limited and solve_dl.remaining() < SETUP_FACTOR * presolve_s:
        # too little time for the exact search's set-up (per-variant tables and bounds, not interruptible, about
        # as long as presolve): it would end late with the warm start anyway; the warm start with eq. B1's bound
        best = planner.best_heuristic(*hints)
        out = planner.finish(ctx, planner.skipped_exact(ctx, options.solver, best, solve_dl))
    else:
        out = planner.orchestrate(ctx, [(options.solver, None)], deadline=solve_dl, hints=hints).outcomes[0]
    if out.result.plan is None:
        return Replan(out, deg, t_deg, None, None, "stay" if deg is not None else "none",
                      "no plan on the new cluster" + ("; the degraded plan still runs" if deg is not None else ""))
    new = out.result.plan
    mig = migration(plan, new, model, training, est, economics.usd_per_hour(new, book))
    t_new = out.estimate.iteration_time_s
    pay = payback_s(t_new, t_deg, mig.time_s)
    choice, note = "migrate", ""
    if max_migration_s is not None and mig.time_s > max_migration_s:
        if deg is None:
            choice, note = "none", (f"the migration takes {mig.time_s:.1f} s > --max-migration {max_migration_s:g} s "
                                    "and the old plan cannot run degraded")
        else:
            choice, note = "stay", f"the migration takes {mig.time_s:.1f} s > --max-migration {max_migration_s:g} s"
    elif deg is not None and pay is None:
        choice, note = "stay", "the new plan is not faster than the degraded one"
    return Replan(out, deg, t_deg, mig, pay, choice, note)
