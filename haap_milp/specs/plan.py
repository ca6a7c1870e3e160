"""The plan: stages with their layers, GPUs and parallel degrees; the status of a solve; rule violations.

Units and conventions: see ``haap_milp.specs`` (the package docstring)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, computed_field, model_serializer, model_validator

from haap_milp.specs.base import (
    Frozen,
    Precision,
    Recompute,
    Schedule,
)


class Status(str, enum.Enum):
    """Outcome of a solve."""

    OPTIMAL = "OPTIMAL"  # proven optimal within the requested relative gap
    FEASIBLE = "FEASIBLE"  # a plan, optimality not proven (gap stated)
    INFEASIBLE = "INFEASIBLE"  # proven: no plan fits (reason stated)
    NO_SOLUTION = "NO_SOLUTION"  # time ran out before any plan was found
    ERROR = "ERROR"  # the solver failed


class Replica(Frozen):
    """One GPU type's data-parallel replicas inside a mixed stage (formulations/ eq. H1-H6)."""

    gpu_type: str = Field(description="Catalog name of the GPU type.")
    island: str = Field(default="main", description="Island its GPUs sit on.")
    tp: int = Field(default=1, description="Tensor-parallel degree of each of these replicas.", ge=1)
    count: int = Field(description="Replicas of this type.", ge=1)
    micro_batch: int = Field(description="Samples of each micro-batch one replica of this type runs.", ge=1)


class StagePlan(Frozen):
    """One pipeline stage: a contiguous layer range on one device group, or, with ``replicas``, on
    data-parallel replicas of several GPU types (a mixed stage: ``gpu_type``, ``island`` and ``tp`` are the
    first replica's, ``dp`` the replica count; each replica type runs its own share of every micro-batch)."""

    first_layer: int = Field(description="First decoder layer (0-based) of this stage.", ge=0)
    num_layers: int = Field(description="Decoder layers in this stage (the first stage also holds the "
                            "embedding, the last the final norm + LM head).", ge=0)
    gpu_type: str = Field(description="Catalog name of the GPU type.")
    island: str = Field(default="main", description="Island its GPUs sit on.")
    tp: int = Field(default=1, description="Tensor-parallel degree (inside one node).", ge=1)
    dp: int = Field(default=1, description="Data-parallel replicas of this stage.", ge=1)
    ep: int = Field(default=1, description="Expert-parallel degree for MoE layers.", ge=1)
    etp: int = Field(default=1, description="Expert tensor-parallel degree.", ge=1)
    recompute: Recompute = Field(default="none", description="Activation recomputation.")
    time_s: float | None = Field(default=None, description="Predicted fwd+bwd time of one micro-batch, s.")
    memory_gib: float | None = Field(default=None, description="Predicted peak memory per GPU, GiB (mixed stage: "
                                     "of the replica type closest to its capacity, as a share of that capacity "
                                     "times the first type's capacity).")
    replicas: tuple[Replica, ...] = Field(default=(), description="Mixed stage: its replica types (empty: one type, "
                                          "tp and dp as above).")
    zero: Literal[0, 1, 2, 3] | None = Field(default=None, description="ZeRO stage of this stage: 0 plain data "
                                             "parallel, 1 sharded optimizer state, 2 + gradients, 3 + weights (FSDP); "
                                             "None: the runtime's (formulations/ eq. Z1).")

    @model_validator(mode="after")
    def _mixed_consistent(self) -> StagePlan:
        if self.replicas:
            r0 = self.replicas[0]
            if (r0.gpu_type, r0.island, r0.tp) != (self.gpu_type, self.island, self.tp):
                raise ValueError("a mixed stage's gpu_type, island and tp are its first replica's")
            if self.zero is not None:
                raise ValueError("a mixed stage runs the runtime's ZeRO stage (zero must be unset)")
            if sum(r.count for r in self.replicas) != self.dp:
                raise ValueError(f"a mixed stage's dp ({self.dp}) is its replica count "
                                 f"({sum(r.count for r in self.replicas)})")
        return self

    @model_serializer(mode="wrap")
    def _single_type_as_before(self, handler):
        """A single-type stage is written without ``replicas`` (plan files as before mixed stages)."""
        out = handler(self)
        if not self.replicas and isinstance(out, dict):
            out.pop("replicas", None)
        if self.zero is None and isinstance(out, dict):
            out.pop("zero", None)  # plan files as before the per-stage ZeRO stage
        return out

    @computed_field(description="GPUs used: tp * dp (* cp of the plan); a mixed stage: sum of tp * count.")  # type: ignore[prop-decorator]
    @property
    def num_gpus(self) -> int:
        return sum(r.tp * r.count for r in self.replicas) if self.replicas else self.tp * self.dp

    @property
    def is_mixed(self) -> bool:
        return bool(self.replicas)

    @property
    def samples(self) -> int | None:
        """Samples per micro-batch a mixed stage runs (sum of count x micro_batch); None for one type."""
        return sum(r.count * r.micro_batch for r in self.replicas) if self.replicas else None

    @property
    def last_layer(self) -> int:
        """One past the last layer (exclusive end)."""
        return self.first_layer + self.num_layers


class Plan(Frozen):
    """A full training plan: stages in pipeline order, batch split and schedule.

    Micro-batch convention (FlagScale heterogeneous meshes): every stage sees the same
    ``samples_per_microbatch`` per micro-batch; stage j splits them over its ``dp`` replicas,
    so its per-replica micro-batch is ``samples_per_microbatch / dp_j``.
    ``micro_batch_size`` is the per-replica size of the first stage (Megatron's meaning
    when dp is uniform).
    """

    model: str = Field(description="Model name (display).")
    cluster: str = Field(default="", description="Cluster name (display).")
    stages: tuple[StagePlan, ...] = Field(description="Stages in pipeline order.", min_length=1)
    micro_batch_size: int = Field(description="Per-replica micro-batch of the first stage, sequences.", ge=1)
    num_microbatches: int = Field(description="Micro-batches per iteration (gradient accumulation).", ge=1)
    global_batch_size: int = Field(description="Sequences per iteration.", ge=1)
    seq_len: int = Field(description="Tokens per sequence.", ge=1)
    precision: Precision = Field(default="bf16", description="Compute precision.")
    schedule: Schedule = Field(default="1f1b", description="Pipeline schedule.")
    vpp: int = Field(default=1, description="Virtual pipeline stages per stage (interleaved 1F1B).", ge=1)
    cp: int = Field(default=1, description="Context-parallel degree (same for all stages).", ge=1)
    sequence_parallel: bool = Field(default=True, description="Sequence parallelism where tp > 1.")
    distributed_optimizer: bool = Field(default=True, description="Optimizer state sharded over dp.")

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def samples_per_microbatch(self) -> int:
        """B: every stage runs B samples per micro-batch. A mixed first stage: the sum over its replicas."""
        first = self.stages[0]
        return first.samples if first.replicas else self.micro_batch_size * first.dp

    @property
    def num_gpus(self) -> int:
        return sum(s.num_gpus for s in self.stages) * self.cp

    def stage_micro_batch(self, j: int) -> float:
        """Per-replica micro-batch of stage j (sequences; a mixed stage: the mean over its replicas)."""
        return self.samples_per_microbatch / self.stages[j].dp

    @property
    def has_mixed_stage(self) -> bool:
        return any(s.replicas for s in self.stages)

    @property
    def is_uniform(self) -> bool:
        """Same tp, dp, recompute, ep and etp on every stage and no mixed stage (what Megatron-LM/torchtitan can
        run)."""
        if self.has_mixed_stage:
            return False
        first = self.stages[0]
        key = (first.tp, first.dp, first.recompute, first.ep, first.etp, first.zero)
        return all((s.tp, s.dp, s.recompute, s.ep, s.etp, s.zero) == key for s in self.stages)


@dataclass(frozen=True)
class Violation:
    """A broken rule: which rule, which stage (None: the whole plan), and the numbers."""

    rule: str
    stage: int | None
    message: str

    def __str__(self) -> str:
        where = "plan" if self.stage is None else f"stage {self.stage}"
        return f"[{self.rule}] {where}: {self.message}"
