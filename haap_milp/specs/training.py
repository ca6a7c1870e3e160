"""The training setup: batch, sequence, precision, optimizer and memory headroom.

Units and conventions: see ``haap_milp.specs`` (the package docstring)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_serializer, model_validator

from haap_milp.specs.base import (
    Engine,
    Frozen,
    Precision,
    Recompute,
    UniformDim,
)

# The most of each GPU's memory a plan may keep free: at 90 % an 80 GiB part plans on 8 GiB, far more headroom than
# fragmentation takes (15-23 % measured, --memory-headroom's help); one rule for the flag and the training file
MAX_HEADROOM_FRACTION = 0.9


def megatron_cannot_shard(engine: str, zero_stage: int | None) -> bool:
    """The megatron preset is Megatron-Core's DDP: ZeRO 0 or 1 (the distributed optimizer). Its ZeRO-2/3 is
    Megatron-FSDP, whose overlap the preset does not model (estimator/runtime.zero_stages; the fsdp engine prices
    them); before, zero_stage 3 was priced as ZeRO-3 and the Megatron emitter launched ZeRO-1. (The flags' check,
    cli/runtime_opts.build_training, says the same in the flags' words.)"""
    return engine == "megatron" and zero_stage in (2, 3)


class TrainingSpec(Frozen):
    """What is trained and how: batch, sequence, precision, optimizer memory."""

    global_batch_size: int = Field(default=512, description="Global batch, in sequences.", ge=1, le=100_000_000)
    seq_len: int = Field(default=4096, description="Sequence length, tokens.", ge=1, le=100_000_000)
    precision: Precision = Field(default="bf16", description="Compute precision of the GEMMs.")
    optimizer_state_bytes_per_param: float = Field(
        default=12.0,
        description="Optimizer bytes per parameter: Adam keeps fp32 master weights, m and v = 12 "
        "(Megatron docs/user-guide/features/dist_optimizer.md).",
        ge=0,
        le=64,
    )
    distributed_optimizer: bool = Field(
        default=True, description="Shard optimizer state (and fp32 grads) over data-parallel ranks (ZeRO-1)."
    )
    sequence_parallel: bool = Field(default=True, description="Megatron sequence parallelism when tp > 1.")
    grad_reduce_in_fp32: bool | None = Field(
        default=None, description="Megatron DDP keeps and reduces the main gradients in fp32 (4 B/param) instead of "
        "the 16-bit parameter dtype (2 B; NVIDIA's NeMo 2 / Megatron-Bridge performance recipes set "
        "grad_reduce_in_fp32=False); None: fp32 with bf16/fp8 (Megatron-LM's bf16 default), 16-bit with fp16.")
    memory_headroom_fraction: float = Field(
        default=0.05, description="Fraction of each GPU's memory kept free (fragmentation, spikes).", ge=0,
        le=MAX_HEADROOM_FRACTION)
    # --- the training runtime (README "Training runtime"; estimator/runtime.py resolves presets and overrides)
    engine: Engine = Field(
        default="megatron", description="Training runtime whose overlap and memory accounting to model: megatron | "
        "deepspeed | fsdp (presets in estimator/runtime.py).")
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        default=None, description="ZeRO stage: 0 plain data parallel, 1 sharded optimizer state, 2 + sharded "
        "gradients, 3 + sharded weights; None: 1 with distributed_optimizer, else 0 (fsdp: 3).")
    grad_reduce_overlap: bool | None = Field(
        default=None, description="Gradient reduction overlapped with the backward pass; None: the engine's preset.")
    param_gather_overlap: bool | None = Field(
        default=None, description="Parameter all-gather overlapped with compute; None: the engine's preset.")
    grad_bucket_bytes: float | None = Field(
        default=None, description="Gradient bucket size, bytes; None: the engine's preset.", gt=0, le=1e12)
    recompute_modes: tuple[Recompute, ...] = Field(
        default=("none", "selective", "full"), description="Recomputation modes the runtime allows.", min_length=1)
    micro_batch_size: int | None = Field(
        default=None, description="Fixed per-replica micro-batch, sequences; None: the planner chooses.", ge=1,
        le=1_000_000)
    uniform: tuple[UniformDim, ...] = Field(
        default=(), description="Dimensions that must be equal in every stage: tp, dp, mbs, recompute, ep.")

    @model_validator(mode="after")
    def _mbs_divides_batch(self) -> TrainingSpec:
        # every stage's replicas split a common micro-batch B = mbs x dp, and B divides the global batch
        if self.micro_batch_size and self.global_batch_size % self.micro_batch_size:
            raise ValueError(f"the fixed micro-batch ({self.micro_batch_size}) must divide the global batch "
                             f"({self.global_batch_size}): every micro-batch is mbs x dp samples and the global "
                             "batch is a whole number of micro-batches")
        return self

    @model_validator(mode="after")
    def _zero_agrees_with_dist_opt(self) -> TrainingSpec:
        # distributed_optimizer false is plain data parallel (ZeRO 0): a sharding stage beside it is a contradiction,
        # not a choice to settle silently (the estimate would price one and the emitted launch set the other)
        if self.zero_stage and not self.distributed_optimizer:
            raise ValueError(f"zero_stage {self.zero_stage} shards optimizer state over data parallelism, but "
                             "distributed_optimizer is off (plain data parallel, ZeRO 0); give one of the two")
        return self

    @model_validator(mode="after")
    def _zero_the_engine_runs(self) -> TrainingSpec:
        if megatron_cannot_shard(self.engine, self.zero_stage):
            raise ValueError(f"zero_stage {self.zero_stage} with engine megatron: the megatron runtime runs ZeRO 0 or 1 "
                             "(--use-distributed-optimizer); use engine fsdp for ZeRO 2 or 3")
        return self

    @model_serializer(mode="wrap")
    def _omit_runtime_defaults(self, handler):  # a spec without runtime settings serialises as before
        data = handler(self)
        if isinstance(data, dict):
            for k in _RUNTIME_FIELDS:
                if k in data and getattr(self, k) == TrainingSpec.model_fields[k].default:
                    data.pop(k)
        return data


_RUNTIME_FIELDS = ("engine", "zero_stage", "grad_reduce_overlap", "param_gather_overlap", "grad_bucket_bytes",
                   "recompute_modes", "micro_batch_size", "uniform")
