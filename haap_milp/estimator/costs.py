"""Assemble a ``StageCost`` (time, memory, DP sync, FLOPs) per layer kind on one GPU of a stage."""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.estimator import comm, compute, flops, layers, memory
from haap_milp.estimator.calibration import Calibration
from haap_milp.estimator.hardware import Hardware
from haap_milp.estimator.kernels import Implementation
from haap_milp.estimator.results import StageCost
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


def grad_bytes(precision: str) -> float:
    """Gradient element size in the DP reduction: fp32 main grads with bf16/fp8, fp16 with fp16 (Megatron table)."""
    return 2.0 if precision == "fp16" else 4.0


def _dp_collective(kind: str, grp: ParamGroup, hw: Hardware, element_bytes: float) -> comm.Cost:
    """A DP collective of this group on its links (measured network: at one bucket, hardware.dp_links)."""
    return comm.group_collective(kind, grp.n, grp.span, hw.gpus_per_node,
                                 *hw.dp_links(kind, grp.n, grp.span, element_bytes))


def static_and_sync(groups: list[ParamGroup], hw: Hardware, training: TrainingSpec, cal: Calibration
                    ) -> tuple[memory.ParamBytes, float, float, float]:
    """(bytes held per GPU by kind, raw DP comm s, optimizer step s, DP latency s) of these parameters.

    Distributed optimizer: reduce-scatter of the gradients + all-gather of the 16-bit parameters
    (Megatron dist_optimizer.md); otherwise one all-reduce of the gradients."""
    w = g = o = 0.0
    comm_s = opt_s = lat = 0.0
    dist = training.distributed_optimizer
    for grp in groups:
        bpp = memory.bytes_per_param(training.precision, dist, grp.n, training.optimizer_state_bytes_per_param)
        w, g, o = w + grp.params * bpp.weights, g + grp.params * bpp.grads, o + grp.params * bpp.optimizer
        gb = grp.params * grad_bytes(training.precision)
        if grp.n > 1:
            if dist:
                rs = _dp_collective("reduce_scatter", grp, hw, grad_bytes(training.precision))
                ag = _dp_collective("all_gather", grp, hw, memory.A)
                comm_s += rs.per_byte_s * gb + ag.per_byte_s * grp.params * memory.A
                lat = max(lat, rs.latency_s + ag.latency_s)
            else:
                ar = _dp_collective("all_reduce", grp, hw, grad_bytes(training.precision))
                comm_s += ar.per_byte_s * gb
                lat = max(lat, ar.latency_s)
        opt_s += compute.optimizer_step_s(grp.params / (grp.n if dist else 1), hw.gpu, hw.params)
    return memory.ParamBytes(w, g, o), comm_s, opt_s, lat


def _assemble(passes: layers.Passes, recompute: str, held: memory.ParamBytes, comm_s: float, opt_s: float,
              act: float, fl: flops.LayerFlops, cal: Calibration) -> StageCost:
    comp, tp_s, ep_s, cp_s = layers.exposed(passes, recompute, cal)
    return StageCost(
        time_s=comp + tp_s + ep_s + cp_s, compute_s=comp, tp_comm_s=tp_s, ep_comm_s=ep_s, cp_comm_s=cp_s,
        static_bytes=held.total, act_bytes=act, sync_s=(1 - cal.globals.dp_overlap) * comm_s + opt_s,
        model_flops=fl.model, hw_flops=fl.hardware(recompute), weights_bytes=held.weights,
        grads_bytes=held.grads, optimizer_bytes=held.optimizer, dp_comm_s=comm_s, optimizer_s=opt_s)


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


def decoder_cost(model: ModelSpec, moe: bool, c: StageConfig, hw: Hardware, training: TrainingSpec,
                 cal: Calibration, passes: layers.Passes, impl: Implementation) -> StageCost:
    """One decoder layer (dense or MoE) on one GPU of the stage, one micro-batch of B samples."""
    seq, b = training.seq_len, c.micro_batch
    sp = training.sequence_parallel and c.tp > 1
    held, comm_s, opt_s, _ = static_and_sync(layer_groups(model, moe, c), hw, training, cal)
    act = memory.layer_activation_bytes(model, moe, b, seq, c.tp, sp, c.recompute, c.cp, c.etp, impl)
    kind = flops.moe_layer_flops if moe else flops.dense_layer_flops
    return _assemble(passes, c.recompute, held, comm_s, opt_s, act, kind(model, c.samples * seq, seq), cal)


def embedding_cost(model: ModelSpec, c: StageConfig, hw: Hardware, training: TrainingSpec,
                   cal: Calibration) -> StageCost:
    """Input embedding (vocab-parallel) on the first stage; recomputation does not apply to it."""
    seq, b = training.seq_len, c.micro_batch
    passes = layers.embedding_passes(model, hw, b * seq / c.cp, c.tp)
    groups = [ParamGroup(model.embedding_params / c.tp, c.dp * c.cp, c.tp)]
    held, comm_s, opt_s, _ = static_and_sync(groups, hw, training, cal)
    act = memory.embedding_activation_bytes(b, seq, c.cp)
    return _assemble(passes, "none", held, comm_s, opt_s, act, flops.LayerFlops(0.0, 0.0), cal)


def head_cost(model: ModelSpec, c: StageConfig, hw: Hardware, training: TrainingSpec,
              cal: Calibration, impl: Implementation) -> StageCost:
    """Final norm + LM head + loss on the last stage. With tied embeddings the last stage still holds a
    copy of the embedding matrix for the head (Megatron, pp > 1); a single-stage plan counts it twice."""
    seq, b = training.seq_len, c.micro_batch
    sp = training.sequence_parallel and c.tp > 1
    passes = layers.head_passes(model, hw, training.precision, b * seq / c.cp, c.tp, sp)
    groups = [ParamGroup(model.vocab_size * model.hidden / c.tp + model.hidden, c.dp * c.cp, c.tp)]
    held, comm_s, opt_s, _ = static_and_sync(groups, hw, training, cal)
    act = memory.head_activation_bytes(model, b, seq, c.tp, c.cp, impl)
    return _assemble(passes, "none", held, comm_s, opt_s, act, flops.head_flops(model, c.samples * seq), cal)


def dp_latency_s(model: ModelSpec, c: StageConfig, hw: Hardware, training: TrainingSpec, cal: Calibration) -> float:
    """Latency part of a stage's DP sync (once per stage: the bucketed collectives' start-up), exposed share.
    Uses the non-expert DP group only, so it depends on (gpu, island, tp, dp, cp) and not on ep."""
    _, _, _, lat = static_and_sync(layer_groups(model, False, c), hw, training, cal)
    return (1 - cal.globals.dp_overlap) * lat
