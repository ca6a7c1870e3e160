"""What the estimator returns: per-layer-kind costs and whole-plan estimates (plain frozen dataclasses)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from haap_milp.pipeline import GIB  # noqa: F401  (re-exported: estimator modules import it from here)


@dataclass(frozen=True)
class StageCost:
    """Cost of one layer kind (or a sum of them) on one GPU of a stage, for one micro-batch.

    ``time_s = compute_s + tp_comm_s + ep_comm_s + cp_comm_s + zero3_comm_s`` (forward + backward, recompute
    included, exposed communication only). ``static_bytes = weights_bytes + grads_bytes +
    optimizer_bytes``. ``act_bytes``: activations kept for ONE in-flight micro-batch. ``sync_s``:
    exposed DP gradient sync + optimizer step for these parameters (once per iteration).
    ``model_flops`` / ``hw_flops``: per micro-batch, whole layer, all tp ranks of one replica x dp
    replicas (i.e. the whole micro-batch of the stage).
    """

    time_s: float = 0.0
    compute_s: float = 0.0
    tp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    cp_comm_s: float = 0.0
    static_bytes: float = 0.0
    act_bytes: float = 0.0
    sync_s: float = 0.0
    model_flops: float = 0.0
    hw_flops: float = 0.0
    weights_bytes: float = 0.0
    grads_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    dp_comm_s: float = 0.0  # raw DP collective time before the hidden fraction (for reports)
    optimizer_s: float = 0.0  # optimizer step (included in sync_s)
    zero3_comm_s: float = 0.0  # ZeRO-3 / FSDP per-micro-batch parameter gathers + gradient reduce-scatter, exposed

    def __add__(self, other: StageCost) -> StageCost:
        return StageCost(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def scaled(self, k: float) -> StageCost:
        return StageCost(**{f.name: getattr(self, f.name) * k for f in fields(self)})

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class StageEstimate:
    """One pipeline stage of a plan, per GPU."""

    index: int
    gpu_type: str
    num_layers: int
    time_s: float  # t_j: forward + backward of one micro-batch
    memory_gib: float
    capacity_gib: float  # usable (after headroom)
    fits: bool
    inflight_microbatches: float
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds per iteration and GiB parts

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PlanEstimate:
    """Whole-plan prediction (problem.py eq. T1 for 1F1B; closed forms for interleaved / gpipe)."""

    iteration_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float  # model FLOPs
    hw_tflops_per_gpu: float  # hardware FLOPs (recompute included)
    mfu: float  # model FLOP/s / sum of the used GPUs' own dense peaks
    hfu: float
    peak_memory_gib: float
    fits: bool
    num_gpus: int
    stages: list[StageEstimate]
    schedule: str = "1f1b"
    notes: list[str] = field(default_factory=list)
    boundary_s: list[float] = field(default_factory=list)  # c_j: p2p time of boundary j -> j+1 per micro-batch
    wrap_boundary_s: float = 0.0  # last -> first stage p2p time per micro-batch (interleaving; 0 when P = 1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def not_fitting(self) -> list[str]:
        """One line per stage that does not fit, with the numbers."""
        return [
            f"stage {s.index} ({s.gpu_type}, {s.num_layers} layers) needs {s.memory_gib:.2f} GiB per GPU, "
            f"{s.capacity_gib:.2f} GiB usable"
            for s in self.stages
            if not s.fits
        ]


@dataclass(frozen=True)
class ComputeBound:
    """Throughput if every GPU ran at its calibrated best GEMM efficiency, perfectly balanced, no communication."""

    tokens_per_s: float
    iteration_time_s: float
    cluster_tflops: float  # sum over GPUs of peak x best efficiency
    per_type_tflops: dict[str, float] = field(default_factory=dict)
