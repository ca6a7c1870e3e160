"""The training runtime as input: what each engine overlaps, shards and buckets (README "Training runtime").

A ``TrainingSpec`` names an ``engine`` and may override any of its presets; ``resolve`` turns it into the
``Runtime`` the cost model reads. Presets (each as the engine really behaves by default):

* **megatron** - Megatron-Core DDP with ``overlap_grad_reduce`` / ``overlap_param_gather`` (Megatron-LM
  ``megatron/core/distributed/distributed_data_parallel_config.py``; ``docs/.../dist_optimizer.md``):
  gradients reduced in buckets while the backward runs (the hidden share is the calibrated
  ``GlobalParams.dp_overlap``), distributed optimizer = ZeRO-1 (reduce-scatter + all-gather of the 16-bit
  parameters). Bucket: max(40M, 1M x dp) elements (``pricing.dp_bucket_bytes``). This is haap's model
  before runtimes were inputs; its numbers are unchanged.
* **deepspeed** - the PipelineEngine (``deepspeed/runtime/pipe/engine.py``): the ``ReduceGrads``
  instruction of ``TrainSchedule`` runs after the last backward of the iteration, so the data-parallel
  all-reduce of the gradients is fully exposed (ZeRO stage 0/1; ``overlap_comm`` defaults to False for ZeRO
  1/2: ``deepspeed/runtime/zero/config.py``); buckets of ``MEMORY_OPT_ALLREDUCE_SIZE`` = 5e8 elements
  (``allreduce_gradients(bucket_size=...)`` -> ``allreduce_no_retain(numel_per_bucket=...)``: a count of
  elements; Sailor's planner reads it as 5e8 bytes - ``--grad-bucket 5e8`` prices that). Each bucket is one
  NCCL all-reduce over the stage's replicas, priced as a flat **ring** (``ring``: comm.ring_measured): every
  step sends one chunk (bucket / dp) from a GPU to the next replica over one GPU's stream, the tp rings of a
  tensor-parallel group crossing the VM's NIC together (network/pricing.py: that many concurrent senders).
  Tensor-parallel all-reduces are not overlapped either (``tp_overlap`` off: Megatron-DeepSpeed's row/column
  parallel layers reduce synchronously inside autograd; the calibrated hidden share is Megatron-Core/TE's
  ``--tp-comm-overlap``). Pipeline sends and receives block the stage (``p2p_blocking``: the engine's
  ``SendActivation`` / ``RecvActivation`` / ``SendGrad`` / ``RecvGrad`` instructions call the synchronous
  ``p2p.send`` / ``p2p.recv`` in the stage's own instruction stream, ``deepspeed/runtime/pipe/p2p.py``), so
  a stage's period holds its own sends (pipeline.py eq. T2b: one way of each boundary, an end stage its
  boundary's round trip), and every stage reduces its gradients after the pipeline flush (eq. T3, beta = 0:
  ReduceTiedGrads then ReduceGrads end ``TrainSchedule``). ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients (reduce-scatter instead of all-reduce); the
  updated parameters are all-gathered after the step, exposed. ``--no-dist-opt`` = ZeRO stage 0, plain DP.
* **fsdp** - PyTorch FSDP ``FULL_SHARD`` (= ZeRO-3, Rajbhandari et al. SC'20 sec. 5): weights, gradients
  and optimizer state sharded over dp; each layer's parameters all-gathered before its forward and again
  before its backward, gradients reduce-scattered after it; ``forward_prefetch`` / ``BACKWARD_PRE`` prefetch
  overlaps both with compute (the same calibrated hidden share as Megatron's overlapped reduction).
  ``--no-dist-opt`` = ``NO_SHARD`` (plain DDP).

Flags (``--zero-stage``, ``--dist-opt/--no-dist-opt``, ``--grad-overlap on|off``, ``--param-overlap on|off``,
``--grad-bucket``) override the preset.
"""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.specs import FP32_PRECISIONS, TrainingSpec

#: DeepSpeed ``reduce_bucket_size`` / ``allreduce_bucket_size`` default: 5e8 elements
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000

#: The presets, one row per engine: (zero stage without / with the distributed optimizer, grad overlap,
#: param-gather overlap, bucket elements (None: Megatron's rule), what it is). README table is this.
PRESETS: dict[str, dict] = {
    "megatron": {"zero": (0, 1), "zero_stages": (0, 1), "grad_overlap": True, "param_overlap": True, "bucket_elements": None,
                 "ring": False, "tp_overlap": True,
                 "p2p_blocking": False, "what": "Megatron-Core DDP, overlap_grad_reduce + overlap_param_gather; dist-opt = ZeRO-1"},
    "deepspeed": {"zero": (0, 1), "zero_stages": (0, 1), "grad_overlap": False, "param_overlap": False,
                  "bucket_elements": DEEPSPEED_BUCKET_ELEMENTS, "ring": True,
                  "tp_overlap": False, "p2p_blocking": True, "uniform": ("dp",),
                  "what": "PipelineEngine: gradient all-reduce after the last backward (ReduceGrads), exposed"},
    "fsdp": {"zero": (0, 3), "zero_stages": (0, 1, 2, 3), "grad_overlap": True, "param_overlap": True, "bucket_elements": None, "ring": False,
             "tp_overlap": True, "p2p_blocking": False, "what": "FSDP FULL_SHARD (ZeRO-3): per-layer all-gather fwd + bwd, reduce-scatter, prefetched"},
}


@dataclass(frozen=True)
class Runtime:
    """The resolved runtime: what the cost model prices."""

    engine: str
    zero_stage: int  # 0 plain DP, 1 sharded optimizer, 2 + grads, 3 + weights
    grad_overlap: bool  # gradient reduction overlapped with backward (calibrated hidden share)
    param_overlap: bool  # parameter all-gather overlapped with compute
    bucket_bytes: float | None  # gradient bucket, bytes (None: Megatron's rule / the measured network's)
    ring: bool = False  # DP collectives as one flat ring of per-GPU streams (DeepSpeed), else hierarchical
    tp_overlap: bool = True  # TP collectives partly hidden behind GEMMs (the calibrated share), else exposed
    p2p_blocking: bool = False  # pipeline sends/receives block the stage (pipeline.py eq. T2b), else overlapped

    @property
    def shards_optimizer(self) -> bool:
        return self.zero_stage >= 1


def zero_stages(engine: str) -> tuple[int, ...]:
    """ZeRO stages the runtime can run per stage (formulations/ eq. Z1; the ``--zero auto`` search set):

    * megatron - Megatron-Core DDP (0) and its distributed optimizer (1, ``--use-distributed-optimizer``).
      Megatron-Core also ships Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy
      optim|optim_grads|optim_grads_params``, megatron/core/distributed/fsdp/), a different DDP wrapper whose
      overlap this preset does not model, so 2 and 3 are not searched here (``--engine fsdp`` prices them).
    * deepspeed - 0 and 1 only: ``PipelineEngine.__init__`` asserts ``zero_optimization_stage() < 2``
      ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism", deepspeed/runtime/pipe/engine.py).
    * fsdp - 0 (replicate / NO_SHARD), 2 (FSDP2 ``reshard_after_forward=False`` / SHARD_GRAD_OP), 3
      (``reshard_after_forward=True`` / FULL_SHARD), and 1: what FSDP2 becomes under
      torch.distributed.pipelining, whose stages run every backward but the last with
      ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)`` (stage.py
      ``backward_maybe_with_nosync``), so parameters stay gathered and gradients accumulate unsharded through
      the step and are reduce-scattered once: ZeRO-1's memory and traffic (estimator/zero.py)."""
    return PRESETS[engine]["zero_stages"]


def element_bytes(precision: str) -> float:
    """Bytes of one activation / gradient / message element: 4 for fp32 and tf32 (fp32 storage), else 2."""
    return 4.0 if precision in FP32_PRECISIONS else 2.0


def resolve(t: TrainingSpec) -> Runtime:
    """The engine's preset with the spec's explicit settings on top."""
    pre = PRESETS[t.engine]
    zero = t.zero_stage if t.zero_stage is not None else pre["zero"][1 if t.distributed_optimizer else 0]
    grad = pre["grad_overlap"] if t.grad_reduce_overlap is None else t.grad_reduce_overlap
    param = pre["param_overlap"] if t.param_gather_overlap is None else t.param_gather_overlap
    bucket = t.grad_bucket_bytes
    if bucket is None and pre["bucket_elements"] is not None:
        bucket = pre["bucket_elements"] * (4.0 if t.precision != "fp16" else 2.0)
    return Runtime(t.engine, zero, grad, param, bucket, pre["ring"], pre["tp_overlap"], pre["p2p_blocking"])


def uniform_dims(t: TrainingSpec) -> tuple[str, ...]:
    """The dimensions every stage must share: the spec's ``uniform`` plus the engine's own (DeepSpeed's
    PipelineEngine lays its ranks out as one pp x dp grid, ``PipeModelDataParallelTopology``: one dp)."""
    return (*t.uniform, *(d for d in PRESETS[t.engine].get("uniform", ()) if d not in t.uniform))


def describe(t: TrainingSpec) -> dict:
    """What ``estimate`` and ``solve`` print about the runtime."""
    r = resolve(t)
    return {"engine": r.engine, "zero_stage": r.zero_stage, "grad_reduce_overlap": r.grad_overlap,
            "param_gather_overlap": r.param_overlap, "grad_bucket_bytes": r.bucket_bytes,
            "dp_collective": "ring" if r.ring else "hierarchical", "p2p_blocking": r.p2p_blocking}
