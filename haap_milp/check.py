"""The independent checker: is a ``Plan`` valid for this model, cluster and training setup?

It reads the specs alone (plus the estimator's per-stage memory) — never the presolved problem or
a solver — so a bug in presolve or a formulation shows up here. ``check_plan`` returns every broken
rule as ``Violation(rule, stage, message)`` with the numbers; an empty list means valid.

Rules (names as reported):
* ``layers.*`` — every decoder layer in exactly one stage, in order: stage 0 starts at 0, each stage
  starts where the previous ended, no empty stage, the last ends at ``num_layers``;
* ``gpus.*`` — each stage's GPU type exists on its island; GPUs used (tp·dp·cp per stage) do not
  exceed what each type has, nor what each (type, island) has;
* ``tp.*`` — tp divides the attention heads and the key/value heads and fits inside one node;
* ``batch.*`` — every dp divides the samples per micro-batch; global batch = samples per
  micro-batch x micro-batches; a mixed stage's replicas (count x micro_batch per type) run exactly the
  samples of a micro-batch (eqs. H1, H2) and each replica type is checked for tp, GPUs and memory on its own;
* ``ep.*`` / ``cp.*`` — ep = 1 on a dense model; ep divides the experts; ep·etp divides tp·dp·cp
  (MoE parallel folding, Megatron ``parallel_state``); seq_len divisible by 2·cp; ``etp.*`` etp = 1 on a dense model,
  etp divides the expert FFN;
* ``schedule.vpp`` — vpp > 1 only with the interleaved schedule; ``schedule.vpp_microbatches`` — and with a
  multiple of pp micro-batches (eq. I5); ``schedule.vpp_layers`` — vpp <= L - pp + 1, so that some split
  leaves no virtual round empty on every stage (Megatron's layout allows empty chunks on some stages); ``precision.gpu`` — every GPU type
  supports the plan's precision;
* ``memory.capacity`` — the estimator's peak memory per GPU within capacity minus headroom;
* ``runtime.*`` — the training runtime's rules: recompute among the allowed modes, the fixed per-replica
  micro-batch, the ``uniform`` dimensions equal in every stage;
* ``<target>.*`` — the engine's own rules (``emit/<target>.plan_violations``) when a target is given and the
  plan breaks no ``layers.*`` or ``schedule.vpp_layers`` rule.
"""

from __future__ import annotations

import logging
from collections import Counter

from haap_milp.emit import engine_module
from haap_milp.errors import HaapInputError
from haap_milp.estimator.runtime import uniform_dims as runtime_uniform_dims
from haap_milp.parallel_rules import (
    cp_divides_seq,
    ep_divides_experts,
    ep_fits_grid,
    etp_divides_ffn,
    tp_fits_node,
    tp_head_misfits,
    vpp_fills_rounds,
)
from haap_milp.pipeline import GIB, fits_memory
from haap_milp.specs import ClusterSpec, ModelSpec, Plan, TrainingSpec, Violation
from haap_milp.targets import capabilities
from haap_milp.zero import plan_violations as zero_rules

log = logging.getLogger(__name__)

__all__ = ["Violation", "check_plan"]


def _layers(plan: Plan, model: ModelSpec) -> list[Violation]:
    out, pos = [], 0
    for j, s in enumerate(plan.stages):
        if s.first_layer != pos:
            out.append(Violation("layers.order", j, f"starts at layer {s.first_layer}, the previous stage ended at "
                                 f"{pos}" + (" (gap)" if s.first_layer > pos else " (overlap)")))
        if s.num_layers < 1:
            out.append(Violation("layers.empty_stage", j, "holds no decoder layer"))
        pos = s.first_layer + s.num_layers
    total = sum(s.num_layers for s in plan.stages)
    if total != model.num_layers or pos != model.num_layers:
        out.append(Violation("layers.coverage", None, f"stages hold {total} layers ending at {pos}; "
                             f"{model.name} has {model.num_layers}"))
    return out


def _types(s) -> list[tuple[str, str, int, int]]:
    """(gpu_type, island, tp, replicas) per replica type of a stage (one unless mixed)."""
    if s.replicas:
        return [(r.gpu_type, r.island, r.tp, r.count) for r in s.replicas]
    return [(s.gpu_type, s.island, s.tp, s.dp)]


def _gpus(plan: Plan, cluster: ClusterSpec) -> list[Violation]:
    out = []
    cap_type = cluster.gpus_per_type
    cap_group: Counter = Counter()
    for g in cluster.node_groups:
        cap_group[(g.gpu.name, g.island)] += g.num_gpus
    used_type: Counter = Counter()
    used_group: Counter = Counter()
    for j, s in enumerate(plan.stages):
        for gpu_type, island, tp, dp in _types(s):  # a mixed stage: each replica type (eq. H1)
            n = tp * dp * plan.cp
            if gpu_type not in cap_type:
                out.append(Violation("gpus.unknown_type", j, f"GPU type {gpu_type!r} is not in cluster "
                                     f"{cluster.name!r} (has {sorted(cap_type)})"))
                continue
            if (gpu_type, island) not in cap_group:
                out.append(Violation("gpus.island", j, f"no {gpu_type} on island {island!r}"))
            used_type[gpu_type] += n
            used_group[(gpu_type, island)] += n
    for t, n in used_type.items():
        if n > cap_type[t]:
            out.append(Violation("gpus.per_type", None, f"{n} {t} GPUs used, cluster has {cap_type[t]}"))
    for (t, isl), n in used_group.items():
        if (t, isl) in cap_group and n > cap_group[(t, isl)] and used_type[t] <= cap_type[t]:
            out.append(Violation("gpus.per_island", None, f"{n} {t} GPUs used on island {isl!r}, it has "
                                 f"{cap_group[(t, isl)]}"))
    return out


def _parallel(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> list[Violation]:
    out = []
    b = plan.samples_per_microbatch
    for j, s in enumerate(plan.stages):
        for gpu_type, island, tp, _dp in _types(s):
            out += _tp_rules(model, cluster, j, gpu_type, island, tp)
            gpu = cluster.gpu(gpu_type) if gpu_type in cluster.gpus_per_type else None
            if gpu is not None and gpu.peak_tflops(plan.precision) is None:
                out.append(Violation("precision.gpu", j, f"{gpu_type} does not support {plan.precision}"))
        if s.replicas:
            out += _mixed_rules(plan, model, j, s, b)
            continue
        if b % s.dp:
            out.append(Violation("batch.dp_divides", j, f"dp={s.dp} does not divide the {b} samples per micro-batch "
                                 f"(micro_batch_size {plan.micro_batch_size} x dp_0 {plan.stages[0].dp})"))
        if not model.is_moe and s.ep > 1:
            out.append(Violation("ep.dense", j, f"ep={s.ep} on dense model {model.name}"))
        if model.is_moe and not ep_divides_experts(model.num_experts, s.ep):
            out.append(Violation("ep.experts", j, f"ep={s.ep} does not divide {model.num_experts} experts"))
        if not model.is_moe and s.etp > 1:
            out.append(Violation("etp.dense", j, f"etp={s.etp} on dense model {model.name}"))
        if model.is_moe and not etp_divides_ffn(model.expert_ffn, s.etp):
            out.append(Violation("etp.ffn", j, f"etp={s.etp} does not divide the expert FFN {model.expert_ffn}"))
        if not ep_fits_grid(s.tp, s.dp, plan.cp, s.ep, s.etp):
            out.append(Violation("ep.fold", j, f"ep*etp = {s.ep}*{s.etp} does not divide tp*dp*cp = "
                                 f"{s.tp}*{s.dp}*{plan.cp}"))
    if b * plan.num_microbatches != plan.global_batch_size:
        out.append(Violation("batch.global", None, f"{b} samples per micro-batch x {plan.num_microbatches} "
                             f"micro-batches = {b * plan.num_microbatches}, global batch is {plan.global_batch_size}"))
    if not cp_divides_seq(plan.seq_len, plan.cp):
        out.append(Violation("cp.seq", None, f"seq_len {plan.seq_len} not divisible by 2*cp = {2 * plan.cp}"))
    if plan.vpp > 1 and plan.schedule != "interleaved":
        out.append(Violation("schedule.vpp", None, f"vpp={plan.vpp} needs the interleaved schedule, "
                             f"got {plan.schedule!r}"))
    if plan.vpp > 1 and plan.num_microbatches % plan.pp:  # eq. I5 (Megatron-Core 0.16 schedules.py raises)
        out.append(Violation("schedule.vpp_microbatches", None, f"interleaving runs micro-batches in groups of pp: "
                             f"{plan.num_microbatches} micro-batches is not a multiple of pp={plan.pp}"))
    out += _vpp_layers(plan, model)
    return out


def _vpp_layers(plan: Plan, model: ModelSpec) -> list[Violation]:
    """vpp <= L - pp + 1 (``vpp_fills_rounds``): some split of the layers holds a decoder layer in every virtual round."""
    if vpp_fills_rounds(model.num_layers, plan.pp, plan.vpp):
        return []
    most = model.num_layers - plan.pp + 1
    return [Violation("schedule.vpp_layers", None, f"plan.vpp = {plan.vpp} model chunks per stage, but the deepest of "
                      f"{plan.pp} stages holds at most {most} of {model.name}'s {model.num_layers} layers, so some "
                      f"virtual rounds would hold no layer on any stage; use vpp <= {max(most, 1)}")]


def _tp_rules(model: ModelSpec, cluster: ClusterSpec, j: int, gpu_type: str, island: str, tp: int) -> list[Violation]:
    out = []
    misfit = tp_head_misfits(model.num_heads, model.kv_heads, tp)
    if "heads" in misfit:
        out.append(Violation("tp.heads", j, f"tp={tp} does not divide {model.num_heads} attention heads"))
    if "kv_heads" in misfit:
        out.append(Violation("tp.kv_heads", j, f"tp={tp} does not divide {model.kv_heads} key/value heads"))
    nodes = [g.gpus_per_node for g in cluster.node_groups if g.gpu.name == gpu_type and g.island == island]
    if nodes and not tp_fits_node(tp, max(nodes)):
        out.append(Violation("tp.node", j, f"tp={tp} does not fit a node of {max(nodes)} {gpu_type} GPUs"))
    return out


def _mixed_rules(plan: Plan, model: ModelSpec, j: int, s, b: int) -> list[Violation]:
    """A mixed stage (formulations/ eqs. H1, H2): its replicas run all b samples of every micro-batch; no
    expert or tensor-expert parallelism across types, no context parallelism."""
    out = []
    split = sum(r.count * r.micro_batch for r in s.replicas)
    if split != b:
        out.append(Violation("batch.mixed_split", j, "replicas run " + " + ".join(
            f"{r.count}x{r.micro_batch}" for r in s.replicas) + f" = {split} samples per micro-batch, the plan's "
            f"micro-batch has {b}"))
    if s.ep > 1 or s.etp > 1 or plan.cp > 1:
        out.append(Violation("ep.mixed", j, f"ep={s.ep}, etp={s.etp}, cp={plan.cp}: a mixed stage needs 1 for each"))
    if len({(r.gpu_type, r.island, r.tp) for r in s.replicas}) < len(s.replicas):
        out.append(Violation("batch.mixed_types", j, "two replica entries with the same GPU type, island and tp"))
    return out


def _memory(plan: Plan, model, cluster, training, estimator) -> list[Violation]:
    if estimator is None:
        from haap_milp.estimator import Estimator  # the checker's one use of the cost model

        estimator = Estimator(model, cluster, training)
    try:
        est = estimator.estimate(plan)
    except HaapInputError as exc:
        return [Violation("memory.estimate", None, f"the estimator cannot price this plan: {exc}")]
    out = []
    for s in est.stages:
        st = plan.stages[s.index]
        per_type = _mixed_memory(estimator, plan, s) if st.replicas else \
            [(s.gpu_type, s.memory_gib, s.capacity_gib)]
        out += [Violation("memory.capacity", s.index, f"needs {mem:.2f} GiB per {gpu} GPU, {cap:.2f} GiB usable "
                          f"(capacity minus {training.memory_headroom_fraction:.0%} headroom)")
                for gpu, mem, cap in per_type if not fits_memory(mem, cap)]
    return out


def _mixed_memory(estimator, plan: Plan, s) -> list[tuple[str, float, float]]:
    """(gpu_type, GiB, usable GiB) of each replica type of a mixed stage, each against its own capacity
    (eq. H6, exact; the solver's normalised arrays are at least as strict)."""
    from haap_milp.estimator.mixed import type_memory_bytes

    st = plan.stages[s.index]
    keys = tuple((r.gpu_type, r.island, r.tp, r.count, r.micro_batch) for r in st.replicas)
    mc = estimator._for_plan(plan).mixed_costs(keys, st.ep, st.recompute, cp=plan.cp)
    first, last = s.index == 0, s.index == plan.pp - 1
    return [(t.replica[0], type_memory_bytes(t, st.num_layers, s.inflight_microbatches, first, last) / GIB,
             t.capacity_bytes / GIB) for t in mc.types]


def _runtime(plan: Plan, training: TrainingSpec) -> list[Violation]:
    """The training runtime's rules (``TrainingSpec``): allowed recompute modes, a fixed per-replica
    micro-batch, the dimensions that must be equal in every stage."""
    out = []
    for j, s in enumerate(plan.stages):
        if training.micro_batch_size and any(r.micro_batch != training.micro_batch_size for r in s.replicas):
            out.append(Violation("runtime.mbs", j, "a replica's micro-batch is not the runtime's fixed "
                                 f"{training.micro_batch_size}"))
        elif s.replicas and {"tp", "mbs"} & set(training.uniform):  # dp and recompute are compared below
            out.append(Violation("runtime.uniform_mixed", j, "replicas of several GPU types (tp, micro-batch) in one "
                                 f"stage; the runtime needs {', '.join(training.uniform)} equal in every stage"))
        if s.recompute not in training.recompute_modes and not (s.recompute == "op"
                                                                 and "selective" in training.recompute_modes):
            out.append(Violation("runtime.recompute", j, f"recompute {s.recompute!r} is not among the runtime's "
                                 f"allowed modes ({', '.join(training.recompute_modes)})"))
        if training.micro_batch_size and not s.replicas and plan.stage_micro_batch(j) != training.micro_batch_size:
            out.append(Violation("runtime.mbs", j, f"per-replica micro-batch {plan.stage_micro_batch(j):g} is not "
                                 f"the runtime's fixed {training.micro_batch_size}"))
    for dim in runtime_uniform_dims(training):  # the spec's and the engine's (DeepSpeed: one dp)
        values = {plan.stage_micro_batch(j) if dim == "mbs" else getattr(s, dim) for j, s in enumerate(plan.stages)}
        if len(values) > 1:
            out.append(Violation(f"runtime.uniform_{dim}", None, f"{dim} differs between stages "
                                 f"({', '.join(map(str, sorted(values, key=str)))}); the runtime needs it equal"))
    return out


def check_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec | None = None, *,
               target: str = "any", estimator=None, memory: bool = True) -> list[Violation]:
    """Every rule ``plan`` breaks (empty: valid). ``estimator`` (optional) prices memory; without one a
    fresh ``Estimator(model, cluster, training)`` is built. ``memory=False`` skips the memory rule."""
    training = training or TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len,
                                        precision=plan.precision)
    out = _layers(plan, model) + _gpus(plan, cluster) + _parallel(plan, model, cluster)
    structural = any(v.rule.startswith(("layers.", "gpus.unknown", "gpus.island", "batch.", "precision.",
                                        "tp.", "ep.")) for v in out)
    if memory and not structural:
        out += _memory(plan, model, cluster, training, estimator)
    out += _runtime(plan, training)
    caps = capabilities(target)
    out += zero_rules(plan, training, caps)  # eq. Z1: each stage's ZeRO stage runs on the runtime and the target
    mixed = [j for j, s in enumerate(plan.stages) if s.replicas]
    if mixed and not caps.mixed_stages:
        out.append(Violation(f"{target}.mixed_stage", mixed[0], f"its data-parallel replicas differ in GPU type: "
                             f"{caps.mixed_stages_why}"))
    elif caps.module is not None and not any(v.rule.startswith(("layers.", "schedule.vpp_layers")) for v in out):
        out += engine_module(target).plan_violations(plan, model)  # the engine's own rules, on a whole layer split
        # (they lay out every layer and chunk: a hand-edited 1e9 layers or vpp would take minutes)
    if out:
        log.info("plan check: %d violation(s): %s", len(out), "; ".join(map(str, out)))
    return out
