"""Whole-plan estimate: per-stage sums of layer-kind costs, the schedule's closed form, FLOPs and MFU.

Stage j with n_j layers (problem.py eq. T1/M2)::

    t_j   = n_j·layer.time + [j = 0]·first.time + [j = P-1]·last.time
    s_j   = stage_fixed_sync + n_j·layer.sync + [j = 0]·first.sync + [j = P-1]·last.sync
    mem_j = fixed + n_j·(layer.static + a_j·layer.act) + [j = 0]·(first.static + a_j·first.act)
            + [j = P-1]·(last.static + a_j·last.act)
    c_j   = p2p_time(stage j -> j+1)

with a_j from pipeline.inflight and T from pipeline.iteration_time (the one home of the closed forms; the
memory is itemised here per kind, weights / grads / optimizer / activations / overhead, for the report).
The boundary times c_j and the wrap boundary (last -> first stage) go into the PlanEstimate for the
simulator. MFU = model FLOP/s / sum of the used GPUs' own dense peaks at the plan's
precision (heterogeneous clusters: each GPU counts its own peak); HFU the same with hardware FLOPs.
"""

from __future__ import annotations

from typing import Any, Protocol

from haap_milp.errors import PlanInvalidError
from haap_milp.estimator import mixed, schedule
from haap_milp.estimator.compute import peak_flops
from haap_milp.estimator.results import PlanEstimate, StageCost, StageEstimate
from haap_milp.pipeline import GIB, fits_memory
from haap_milp.specs import ModelSpec, Plan


class Estimator(Protocol):
    """What the whole-plan estimate needs of its pricer (``cost_model.Estimator`` is the one there is): the
    cached per-stage costs. Stated as a protocol so that this module does not import the Estimator's."""

    model: ModelSpec

    def hardware(self, gpu_type: str, island: str | None = None) -> Any: ...
    def layer_cost(self, *args: Any, **kw: Any) -> StageCost: ...
    def first_stage_extra(self, *args: Any, **kw: Any) -> StageCost: ...
    def last_stage_extra(self, *args: Any, **kw: Any) -> StageCost: ...
    def stage_fixed_bytes(self, *args: Any, **kw: Any) -> float: ...
    def stage_fixed_sync_s(self, *args: Any, **kw: Any) -> float: ...
    def usable_memory_bytes(self, gpu_type: str) -> float: ...
    def p2p_time(self, *args: Any, **kw: Any) -> float: ...
    def replica_send_s(self, *args: Any, **kw: Any) -> float: ...
    def mixed_costs(self, *args: Any, **kw: Any) -> Any: ...
    @property
    def p2p_blocking(self) -> bool: ...


def check_plan(est: Estimator, plan: Plan) -> None:
    """Plan-level consistency (stage-level rules are checked by the estimator's stage checks)."""
    model = est.model
    layers = [s.num_layers for s in plan.stages]
    if any(n < 1 for n in layers) or sum(layers) != model.num_layers:
        raise PlanInvalidError(f"plan stages hold {layers} layers (sum {sum(layers)}); {model.name} has "
                               f"{model.num_layers} and every stage needs at least one.", field="stages")
    pos = 0
    for j, s in enumerate(plan.stages):
        if s.first_layer != pos:
            raise PlanInvalidError(f"stage {j} starts at layer {s.first_layer}, expected {pos} (contiguous ranges).",
                                   field=f"stages[{j}].first_layer", value=s.first_layer)
        pos += s.num_layers
    b = plan.samples_per_microbatch
    if b * plan.num_microbatches != plan.global_batch_size:
        raise PlanInvalidError(
            f"micro_batch_size x dp of stage 0 x num_microbatches = {plan.micro_batch_size} x {plan.stages[0].dp} x "
            f"{plan.num_microbatches} = {b * plan.num_microbatches}, not global_batch_size={plan.global_batch_size}.",
            field="num_microbatches", value=plan.num_microbatches)
    if plan.vpp > 1 and plan.schedule != "interleaved":
        raise PlanInvalidError(f"vpp={plan.vpp} needs schedule 'interleaved' (got {plan.schedule!r}).", field="vpp")


def replica_keys(s) -> tuple[mixed.ReplicaKey, ...]:
    """A mixed stage's replica types as estimator keys (estimator/mixed.py)."""
    return tuple((r.gpu_type, r.island, r.tp, r.count, r.micro_batch) for r in s.replicas)


def _stage_costs(est: Estimator, plan: Plan, j: int) -> tuple[StageCost, StageCost | None, StageCost | None]:
    s, p = plan.stages[j], plan.pp
    if s.replicas:  # eqs. H3, H4, H6
        mc = est.mixed_costs(replica_keys(s), s.ep, s.recompute, cp=plan.cp)
        return mc.layer, mc.first if j == 0 else None, mc.last if j == p - 1 else None
    args = (s.gpu_type, s.tp, s.dp, s.ep, s.etp, s.recompute, plan.samples_per_microbatch)
    kw = {"island": s.island, "cp": plan.cp, "zero": s.zero}
    first = est.first_stage_extra(*args, **kw) if j == 0 else None
    last = est.last_stage_extra(*args, **kw) if j == p - 1 else None
    return est.layer_cost(*args, **kw), first, last


def _stage_memory(est: Estimator, plan: Plan, j: int, parts: tuple, a: float) -> dict[str, float]:
    """Eq. M2 itemised by kind; the LM head's activations count ``schedule.loss_inflight`` micro-batches (1 unless
    GPipe; the same as eq. M2's a_j under 1F1B, fewer under interleaving)."""
    layer, first, last = parts
    s = plan.stages[j]
    n = s.num_layers
    fixed = est.mixed_costs(replica_keys(s), s.ep, s.recompute, cp=plan.cp).fixed_bytes if s.replicas else \
        est.stage_fixed_bytes(s.gpu_type, s.tp, dp=s.dp, recompute=s.recompute,
                              samples_per_microbatch=plan.samples_per_microbatch, cp=plan.cp, etp=s.etp, ep=s.ep,
                              zero=s.zero)
    out = {"weights": n * layer.weights_bytes, "grads": n * layer.grads_bytes,
           "optimizer": n * layer.optimizer_bytes, "activations": n * a * layer.act_bytes, "overhead": fixed}
    a_last = min(a, schedule.loss_inflight(plan.schedule, plan.num_microbatches))
    for extra, a_x in ((first, a), (last, a_last)):
        if extra is not None:
            out["weights"] += extra.weights_bytes
            out["grads"] += extra.grads_bytes
            out["optimizer"] += extra.optimizer_bytes
            out["activations"] += a_x * extra.act_bytes
    return out


def estimate_plan(est: Estimator, plan: Plan) -> PlanEstimate:
    check_plan(est, plan)
    p, m, v = plan.pp, plan.num_microbatches, plan.vpp
    sched = plan.schedule
    totals, mems, inflight = [], [], []
    for j, s in enumerate(plan.stages):
        parts = _stage_costs(est, plan, j)
        tot = parts[0].scaled(s.num_layers)
        for extra in parts[1:]:
            tot = tot + extra if extra is not None else tot
        totals.append(tot)
        inflight.append(schedule.inflight(sched, j, p, m, v))
        mems.append(_stage_memory(est, plan, j, parts, inflight[-1]))
    t = [x.time_s for x in totals]
    sync = [x.sync_s + _fixed_sync(est, plan, s) for x, s in zip(totals, plan.stages)]
    c = [_boundary(est, plan, j, j + 1) for j in range(p - 1)]
    wrap = _boundary(est, plan, p - 1, 0) if p > 1 else 0.0  # the link interleaving (and the simulator) uses
    c_wrap = wrap if (sched == "interleaved" and v > 1) else 0.0
    it = schedule.iteration_time(sched, t, c, sync, m, v, c_wrap, est.p2p_blocking)
    return _finish(est, plan, it, totals, mems, inflight, t, c, sync, wrap)


def _fixed_sync(est: Estimator, plan: Plan, s) -> float:
    if s.replicas:  # eq. H4
        return est.mixed_costs(replica_keys(s), s.ep, s.recompute, cp=plan.cp).fixed_sync_s
    return est.stage_fixed_sync_s(s.gpu_type, s.island, s.tp, s.dp, cp=plan.cp, ep=s.ep, etp=s.etp, zero=s.zero)


def _ends(s) -> tuple[tuple[str, str, int, int], ...]:
    """(gpu_type, island, tp, dp) per replica type of a stage (one entry unless mixed)."""
    if s.replicas:
        return tuple((r.gpu_type, r.island, r.tp, r.count) for r in s.replicas)
    return ((s.gpu_type, s.island, s.tp, s.dp),)


def _boundary(est: Estimator, plan: Plan, a: int, b: int) -> float:
    """c_j: with the default group-level p2p model this is exactly presolve's p2p_time[g_a][g_b]; a mixed
    stage's boundary is its slowest type pair (eq. H5). Under a runtime whose sends block, two stages of one dp
    exchange per replica pair (eqs. Q1, Q2: presolve's (group, tp) endpoints), each way at the sending
    replica's samples (B / dp; a mixed stage's type: its own share)."""
    sa, sb = plan.stages[a], plan.stages[b]
    if est.p2p_blocking and est.p2p_model == "group" and sa.dp == sb.dp:
        return mixed.replica_boundary_s(est, _replica_ends(plan, sa), _replica_ends(plan, sb), cp=plan.cp)
    return mixed.boundary_s(est, _ends(sa), _ends(sb), plan.samples_per_microbatch, cp=plan.cp)


def _replica_ends(plan: Plan, s) -> tuple[tuple[str, str, int, float], ...]:
    """(gpu_type, island, tp, samples per replica) per replica type of a stage (eq. Q2's endpoint members)."""
    if s.replicas:
        return tuple((r.gpu_type, r.island, r.tp, r.micro_batch) for r in s.replicas)
    return ((s.gpu_type, s.island, s.tp, plan.samples_per_microbatch / s.dp),)


def _finish(est: Estimator, plan: Plan, it: float, totals: list[StageCost], mems: list[dict[str, float]],
            inflight: list[float], t: list[float], c: list[float], sync: list[float], wrap: float) -> PlanEstimate:
    m = plan.num_microbatches
    stages = []
    for j, (tot, mem, s) in enumerate(zip(totals, mems, plan.stages)):
        cap = est.usable_memory_bytes(s.gpu_type)
        used = sum(mem.values())
        busy = m * tot.time_s + sync[j]
        p2p = min(m * c[j], max(0.0, it - busy)) if j < len(c) else 0.0
        brk = {"compute_s": m * tot.compute_s, "tp_comm_s": m * tot.tp_comm_s, "ep_comm_s": m * tot.ep_comm_s,
               "cp_comm_s": m * tot.cp_comm_s, "p2p_s": p2p, "sync_s": sync[j], "bubble_s": it - busy - p2p}
        brk.update({f"{k}_gib": v / GIB for k, v in mem.items()})
        stages.append(StageEstimate(j, s.gpu_type, s.num_layers, t[j], used / GIB, cap / GIB,
                                    bool(fits_memory(used, cap)), inflight[j], brk))
    model_f = m * sum(x.model_flops for x in totals)
    hw_f = m * sum(x.hw_flops for x in totals)
    n = plan.num_gpus
    peak = sum(tp * count * plan.cp * peak_flops(est.hardware(g, isl).gpu, plan.precision)
               for s in plan.stages for g, isl, tp, count in _ends(s))
    notes = []
    if est.model.is_moe and est.model.num_moe_layers < est.model.num_layers:
        notes.append("dense and MoE layers mixed: every stage is charged the mean layer cost")
    return PlanEstimate(
        iteration_time_s=it, tokens_per_s=plan.global_batch_size * plan.seq_len / it,
        tflops_per_gpu=model_f / it / n / 1e12, hw_tflops_per_gpu=hw_f / it / n / 1e12,
        mfu=model_f / it / peak if peak else 0.0, hfu=hw_f / it / peak if peak else 0.0,
        peak_memory_gib=max(s.memory_gib for s in stages), fits=all(s.fits for s in stages), num_gpus=n,
        stages=stages, schedule=plan.schedule, notes=notes, boundary_s=list(c), wrap_boundary_s=wrap)
