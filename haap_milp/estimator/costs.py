"""Assemble a ``StageCost`` (time, memory, DP sync, FLOPs) per layer kind on one GPU of a stage."""

from __future__ import annotations

from dataclasses import dataclass, replace

from haap_milp.estimator import comm, compute, flops, layers, memory, runtime, zero
from haap_milp.estimator.calibration import Calibration
from haap_milp.estimator.hardware import Hardware
from haap_milp.estimator.kernels import Implementation
from haap_milp.estimator.results import StageCost
from haap_milp.network import pricing
from haap_milp.specs import ModelSpec, TrainingSpec


@dataclass(frozen=True)
class StageConfig:
    """Everything that fixes a per-layer cost (hashable cache key)."""

    gpu_type: str
    island: str | None
    tp: int
    dp: int
    ep: int
    etp: int
    recompute: str
    samples: int  # B: samples per micro-batch seen by the stage (split over dp)
    cp: int = 1
    zero: int | None = None  # ZeRO stage of this stage (None: the runtime's; estimator/zero.py)

    @property
    def micro_batch(self) -> float:
        """Per-replica micro-batch b = B / dp."""
        return self.samples / self.dp


@dataclass(frozen=True)
class ParamGroup:
    """Parameters one GPU holds that share a data-parallel group: n ranks spaced ``span`` GPUs apart."""

    params: float
    n: int
    span: int


def grad_bytes(precision: str, in_fp32: bool | None = None) -> float:
    """Gradient element size in the DP reduction: fp32 main grads with bf16/fp8, fp16 with fp16 (Megatron table);
    fp32 gradients in fp32 / tf32 training. ``in_fp32`` (TrainingSpec.grad_reduce_in_fp32) given: 4 if True, else
    the 16-bit parameter dtype's 2 (Megatron-Core DDP ``grad_reduce_in_fp32=False``)."""
    if precision in ("fp32", "tf32"):
        return 4.0
    if in_fp32 is None:
        return 2.0 if precision == "fp16" else 4.0
    return 4.0 if in_fp32 else 2.0


def _dp_collective(kind: str, grp: ParamGroup, hw: Hardware, element_bytes: float,
                   bucket_bytes: float | None = None, ring_bytes: tuple[float, float] | None = None) -> comm.Cost:
    """A DP collective of this group on its links (measured network: at one bucket, hardware.dp_links).
    ``ring_bytes`` = (lo, hi) given (runtime ``ring``, DeepSpeed): a flat ring of per-GPU streams instead,
    priced at its real chunk sizes: the secant between a collective of lo bytes and one of min(hi, bucket)."""
    if ring_bytes is None:
        return comm.group_collective(kind, grp.n, grp.span, hw.gpus_per_node,
                                     *hw.dp_links(kind, grp.n, grp.span, element_bytes, bucket_bytes))
    bucket = bucket_bytes or (pricing.dp_bucket_bytes(hw.network, grp.n, element_bytes) if hw.network
                              else pricing.MEGATRON_BUCKET_ELEMENTS * element_bytes)
    return comm.ring_measured(kind, grp.n, lambda chunk: hw.ring_step_link(chunk, grp.n, grp.span, kind),
                              ring_bytes[0], min(ring_bytes[1], bucket))


@dataclass(frozen=True)
class Sync:
    """DP synchronisation of some parameters: bytes held, raw and exposed per-step collective time, optimizer
    step, exposed latency (once per stage), and ZeRO-2/3's raw collectives per micro-batch (forward, backward;
    s, latency included: estimator/zero.py eq. Z3), whose exposed share ``_assemble`` sets against the compute."""

    held: memory.ParamBytes
    comm_s: float
    exposed_s: float
    opt_s: float
    lat_s: float
    mb_fwd_s: float = 0.0
    mb_bwd_s: float = 0.0


def param_sync(groups: list[ParamGroup], hw: Hardware, training: TrainingSpec, cal: Calibration,
               ring_params: tuple[float, float] | None = None, zero_stage: int | None = None) -> Sync:
    """The runtime's DP synchronisation of these parameters (estimator/runtime.py presets) at ZeRO stage
    ``zero_stage`` (None: the runtime's; formulations/ eqs. Z1-Z3).

    ZeRO 0: one all-reduce of the gradients; ZeRO 1 (Megatron's distributed optimizer): reduce-scatter of
    the gradients + all-gather of the updated parameters per step (Megatron dist_optimizer.md; ZeRO sec. 5.1);
    ZeRO 2 / 3 (FSDP): per micro-batch, one all-gather of the parameters (ZeRO 3: one more before the backward)
    and one reduce-scatter of the gradients (estimator/zero.py). An overlapped per-step collective shows only the
    calibrated exposed share (1 - dp_overlap); one that is not overlapped is fully exposed (DeepSpeed's
    pipeline engine reduces after the last backward). A ``ring`` runtime prices each collective as a flat
    ring (comm.ring_measured), secant between the per-GPU parameter counts ``ring_params`` (``ring_range``;
    default: this call's largest group at both ends)."""
    rt = runtime.resolve(training)
    if zero_stage is not None and zero_stage != rt.zero_stage:
        rt = replace(rt, zero_stage=zero_stage)
    prec = training.precision
    hid = cal.globals.dp_overlap
    pb = compute.act_bytes(prec)  # parameters move at the training element size (16-bit; fp32 in fp32 training)
    w = g = o = 0.0
    comm_s = exposed = opt_s = lat = mb_f = mb_b = 0.0
    default = rt.grad_overlap and rt.param_overlap and rt.zero_stage <= 1 and rt.bucket_bytes is None
    largest = max((x.params for x in groups), default=0.0)
    lo_p, hi_p = ring_params if ring_params is not None else (largest, largest)

    def ring_ends(element_bytes: float) -> tuple[float, float] | None:  # secant ends, bytes (None: hierarchical)
        return (lo_p * element_bytes, hi_p * element_bytes) if rt.ring else None

    gel = grad_bytes(prec, training.grad_reduce_in_fp32)  # main-gradient element, bytes
    for grp in groups:
        bpp = memory.param_bytes(prec, rt.zero_stage, grp.n, training.optimizer_state_bytes_per_param,
                                 grad_element_bytes=gel)
        w, g, o = w + grp.params * bpp.weights, g + grp.params * bpp.grads, o + grp.params * bpp.optimizer
        gb = grp.params * gel
        if grp.n > 1:
            if rt.zero_stage >= 1:
                rs = _dp_collective("reduce_scatter", grp, hw, gel, rt.bucket_bytes, ring_ends(gel))
                ag = _dp_collective("all_gather", grp, hw, pb, rt.bucket_bytes, ring_ends(pb))
                rs_s, ag_s = rs.per_byte_s * gb, ag.per_byte_s * grp.params * pb
                if not zero.per_step(rt.zero_stage):  # eq. Z3: per micro-batch, one collective per layer
                    f, b = zero.microbatch_comm_s(rt.zero_stage, ag.latency_s + ag_s, rs.latency_s + rs_s)
                    mb_f, mb_b = mb_f + f, mb_b + b
                    opt_s += compute.optimizer_step_s(grp.params / grp.n, hw.gpu, hw.params, prec)
                    continue
                comm_s += rs_s + ag_s
                if default:
                    lat = max(lat, rs.latency_s + ag.latency_s)
                else:
                    exposed += ((1 - hid) * rs_s if rt.grad_overlap else rs_s) + \
                        ((1 - hid) * ag_s if rt.param_overlap else ag_s)
                    lat = max(lat, ((1 - hid) * rs.latency_s if rt.grad_overlap else rs.latency_s)
                              + ((1 - hid) * ag.latency_s if rt.param_overlap else ag.latency_s))
            else:
                ar = _dp_collective("all_reduce", grp, hw, gel, rt.bucket_bytes, ring_ends(gel))
                comm_s += ar.per_byte_s * gb
                if default:
                    lat = max(lat, ar.latency_s)
                else:
                    exposed += (1 - hid) * ar.per_byte_s * gb if rt.grad_overlap else ar.per_byte_s * gb
                    lat = max(lat, (1 - hid) * ar.latency_s if rt.grad_overlap else ar.latency_s)
        opt_s += compute.optimizer_step_s(grp.params / (grp.n if rt.shards_optimizer else 1), hw.gpu, hw.params,
                                          prec)
    if default:  # Megatron with overlap: the calibrated hidden share of the whole sync (numbers as before)
        exposed, lat = (1 - hid) * comm_s, (1 - hid) * lat
    return Sync(memory.ParamBytes(w, g, o), comm_s, exposed, opt_s, lat, mb_f, mb_b)


def ring_range(model: ModelSpec, tp: int) -> tuple[float, float]:
    """Per-GPU parameters between which a stage's ring all-reduce is priced (comm.ring_measured's secant):
    one decoder layer (the smallest stage) to half the decoder stack (a large stage; beyond one bucket the
    bucket's own chunk size holds). Exact at both ends; in between the secant errs by a few percent."""
    layer = memory.dense_layer_params_per_gpu(model, tp)
    return layer, max(layer, layer * model.num_layers / 2)


def static_and_sync(groups: list[ParamGroup], hw: Hardware, training: TrainingSpec, cal: Calibration
                    ) -> tuple[memory.ParamBytes, float, float, float]:
    """(bytes held per GPU by kind, raw DP comm s, optimizer step s, exposed DP latency s): ``param_sync``."""
    s = param_sync(groups, hw, training, cal)
    return s.held, s.comm_s, s.opt_s, s.lat_s


def _runtime_cal(training: TrainingSpec, cal: Calibration) -> Calibration:
    """The calibration as the runtime sees it: no hidden TP share where the runtime does not overlap TP
    (runtime.py ``tp_overlap``; the fitted share is Megatron-Core/TE's)."""
    if runtime.resolve(training).tp_overlap or cal.globals.tp_overlap == 0.0:
        return cal
    return replace(cal, globals=replace(cal.globals, tp_overlap=0.0))


def _assemble(passes: layers.Passes, recompute: str, sync: Sync, act: float, fl: flops.LayerFlops,
              cal: Calibration, training: TrainingSpec) -> StageCost:
    comp, tp_s, ep_s, cp_s = layers.exposed(passes, recompute, _runtime_cal(training, cal))
    held = sync.held
    mb = 0.0
    if sync.mb_fwd_s or sync.mb_bwd_s:  # eq. Z4: ZeRO-2/3 collectives against the pass they hide behind
        rt = runtime.resolve(training)
        fwd = passes.fwd_s
        bwd = passes.compute_s(recompute) - fwd
        mb = zero.exposed_s(sync.mb_fwd_s, sync.mb_bwd_s, fwd, bwd, rt.param_overlap, rt.grad_overlap)
        k = cal.globals.overlap_slowdown  # eq. Z4b: the overlapped collectives slow the compute they hide behind
        mb += (comm.overlap_contention_s(sync.mb_fwd_s, fwd, k) if rt.param_overlap else 0.0) + \
            (comm.overlap_contention_s(sync.mb_bwd_s, bwd, k) if rt.grad_overlap else 0.0)
    return StageCost(
        time_s=comp + tp_s + ep_s + cp_s + mb, compute_s=comp, tp_comm_s=tp_s, ep_comm_s=ep_s,
        cp_comm_s=cp_s, static_bytes=held.total, act_bytes=act, sync_s=sync.exposed_s + sync.opt_s,
        model_flops=fl.model, hw_flops=fl.hardware(recompute), weights_bytes=held.weights,
        grads_bytes=held.grads, optimizer_bytes=held.optimizer, dp_comm_s=sync.comm_s, optimizer_s=sync.opt_s,
        zero3_comm_s=mb)


def layer_groups(model: ModelSpec, moe: bool, c: StageConfig) -> list[ParamGroup]:
    d = c.dp * c.cp
    if not moe:
        return [ParamGroup(memory.dense_layer_params_per_gpu(model, c.tp), d, c.tp)]
    non_expert, expert = memory.moe_layer_params_per_gpu(model, c.tp, c.ep, c.etp)
    edp = c.tp * c.dp * c.cp // (c.ep * c.etp)
    return [ParamGroup(non_expert, d, c.tp), ParamGroup(expert, edp, c.ep * c.etp)]


def decoder_passes(model: ModelSpec, moe: bool, c: StageConfig, hw: Hardware, training: TrainingSpec,
                   impl: Implementation) -> layers.Passes:
    """Raw times of one decoder layer; depend on dp only through b = B/dp (shared cache key)."""
    sp = training.sequence_parallel and c.tp > 1
    tokens = c.micro_batch * training.seq_len / c.cp
    return layers.layer_passes(model, moe, hw, training.precision, tokens, training.seq_len, c.tp, sp, c.ep, c.etp,
                               c.cp, impl)


def decoder_sync(model: ModelSpec, moe: bool, c: StageConfig, hw: Hardware, training: TrainingSpec,
                 cal: Calibration) -> Sync:
    """DP sync of one decoder layer's parameters. Reads the stage's GPU (``hw``), tp, dp, cp, ep, etp and ZeRO
    stage only, not its recompute or micro-batch, so the estimator prices it once for all of those
    (``Estimator._sync``, formulations/ eq. O2f)."""
    return param_sync(layer_groups(model, moe, c), hw, training, cal, ring_range(model, c.tp), c.zero)


def decoder_cost(model: ModelSpec, moe: bool, c: StageConfig, hw: Hardware, training: TrainingSpec,
                 cal: Calibration, passes: layers.Passes, impl: Implementation, sync: Sync | None = None,
                 fl: flops.LayerFlops | None = None) -> StageCost:
    """One decoder layer (dense or MoE) on one GPU of the stage, one micro-batch of B samples (``sync``: its
    ``decoder_sync``, ``fl``: its ``layer_flops``, when the caller has them)."""
    seq, b = training.seq_len, c.micro_batch
    sp = training.sequence_parallel and c.tp > 1
    sync = decoder_sync(model, moe, c, hw, training, cal) if sync is None else sync
    act = memory.layer_activation_bytes(model, moe, b, seq, c.tp, sp, c.recompute, c.cp, c.etp, impl,
                                        compute.act_bytes(training.precision),
                                        memory.gemm_input_bytes(training.precision))
    fl = layer_flops(model, moe, c.samples * seq, seq) if fl is None else fl
    return _assemble(passes, c.recompute, sync, act, fl, cal, training)


def layer_flops(model: ModelSpec, moe: bool, tokens: float, seq: int) -> flops.LayerFlops:
    """FLOPs of one decoder layer (dense or MoE) over ``tokens`` (the stage's micro-batch x seq)."""
    return (flops.moe_layer_flops if moe else flops.dense_layer_flops)(model, tokens, seq)


def embedding_sync(model: ModelSpec, c: StageConfig, hw: Hardware, training: TrainingSpec, cal: Calibration) -> Sync:
    """DP sync of the input embedding: reads hw, tp, dp, cp and the ZeRO stage only (eq. O2f)."""
    groups = [ParamGroup(model.embedding_params / c.tp, c.dp * c.cp, c.tp)]
    return param_sync(groups, hw, training, cal, ring_range(model, c.tp), c.zero)


def embedding_cost(model: ModelSpec, c: StageConfig, hw: Hardware, training: TrainingSpec,
                   cal: Calibration, sync: Sync | None = None) -> StageCost:
    """Input embedding (vocab-parallel) on the first stage; recomputation does not apply to it."""
    seq, b = training.seq_len, c.micro_batch
    passes = layers.embedding_passes(model, hw, b * seq / c.cp, c.tp, training.precision)
    sync = embedding_sync(model, c, hw, training, cal) if sync is None else sync
    act = memory.embedding_activation_bytes(b, seq, c.cp)
    return _assemble(passes, "none", sync, act, flops.LayerFlops(0.0, 0.0), cal, training)


def head_sync(model: ModelSpec, c: StageConfig, hw: Hardware, training: TrainingSpec, cal: Calibration) -> Sync:
    """DP sync of the LM head's parameters: reads hw, tp, dp, cp and the ZeRO stage only (eq. O2f)."""
    groups = [ParamGroup(model.vocab_size * model.hidden / c.tp + model.hidden, c.dp * c.cp, c.tp)]
    return param_sync(groups, hw, training, cal, ring_range(model, c.tp), c.zero)


def head_cost(model: ModelSpec, c: StageConfig, hw: Hardware, training: TrainingSpec,
              cal: Calibration, impl: Implementation, sync: Sync | None = None) -> StageCost:
    """Final norm + LM head + loss on the last stage. With tied embeddings the last stage still holds a
    copy of the embedding matrix for the head (Megatron, pp > 1); a single-stage plan counts it twice.
    ``sync``: its ``head_sync`` when the caller has it."""
    seq, b = training.seq_len, c.micro_batch
    sp = training.sequence_parallel and c.tp > 1
    passes = layers.head_passes(model, hw, training.precision, b * seq / c.cp, c.tp, sp)
    sync = head_sync(model, c, hw, training, cal) if sync is None else sync
    act = memory.head_activation_bytes(model, b, seq, c.tp, c.cp, impl)
    return _assemble(passes, "none", sync, act, flops.head_flops(model, c.samples * seq), cal, training)


def dp_latency_s(model: ModelSpec, c: StageConfig, hw: Hardware, training: TrainingSpec, cal: Calibration) -> float:
    """Latency part of a stage's DP sync (once per stage: the bucketed collectives' start-up), exposed share.
    Uses the non-expert DP group only, so it depends on (gpu, island, tp, dp, cp) and not on ep."""
    return param_sync(layer_groups(model, False, c), hw, training, cal, ring_range(model, c.tp), c.zero).lat_s
