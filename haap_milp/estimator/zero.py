"""ZeRO / FSDP per stage: which collectives run per micro-batch, how much of them the runtime hides, and the
transient bytes of gathered parameters (formulations/README.md eqs. Z1-Z5).

Stages (Rajbhandari et al., "ZeRO", SC'20, sec. 5; PyTorch FSDP2 ``fully_shard``):

* **0** plain data parallel: one gradient all-reduce per step (costs.param_sync).
* **1** sharded optimizer state (Megatron's distributed optimizer): one gradient reduce-scatter and one
  all-gather of the updated parameters per step (costs.param_sync). Under torch.distributed.pipelining an
  FSDP2 stage is this too: its schedule runs every backward but the last without gradient sync and without
  resharding (``backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)``,
  ``set_reshard_after_backward(False)``), so the gathered parameters and the unsharded gradients stay for the
  whole step and one reduce-scatter ends it.
* **2** + sharded gradients (FSDP2 ``reshard_after_forward=False``, FSDP1 SHARD_GRAD_OP), without pipelining's
  no-sync: per micro-batch and layer one parameter all-gather before the forward (the parameters stay gathered
  until the layer's backward, so in the 1F1B steady state the 16-bit weights are whole, eq. Z2) and one
  gradient reduce-scatter after the backward (eq. Z3).
* **3** + sharded weights (FSDP2 ``reshard_after_forward=True``, FULL_SHARD): per micro-batch and layer an
  all-gather before the forward, another before the backward, and the reduce-scatter (eq. Z3); only the
  layers being computed or prefetched hold whole weights (eq. Z5).

Overlap (eq. Z4): FSDP2 issues the next layer's all-gather while the current layer computes (implicit forward
prefetch, ``backward_prefetch`` / ``set_modules_to_backward_prefetch``) and reduce-scatters a layer's gradients
while the previous layer's backward runs, on their own streams; so with ``param_overlap`` / ``grad_overlap``
the exposed time of a layer is what its collectives take beyond the compute of that pass
(max(0, comm - compute)), and without them all of it. The stage's first all-gather of each micro-batch has no
compute to hide behind (one layer's gather per stage and micro-batch, left out: O(1/n_j)).
"""

from __future__ import annotations

#: ZeRO stages, what each shards (for messages and docs)
SHARDS = {0: "nothing", 1: "optimizer state", 2: "optimizer state + gradients",
          3: "optimizer state + gradients + weights"}


def per_step(zero: int) -> bool:
    """Whether the stage's DP collectives run once per step (0, 1) rather than per micro-batch (2, 3)."""
    return zero <= 1


def microbatch_comm_s(zero: int, gather_s: float, scatter_s: float) -> tuple[float, float]:
    """Eq. Z3: raw (forward, backward) collective seconds per micro-batch of one layer's parameters:
    ``gather_s`` one all-gather of the 16-bit parameters, ``scatter_s`` one reduce-scatter of the gradients
    (latency included: FSDP runs one collective per layer). ZeRO-2 gathers once (before the forward) and
    reduce-scatters after the backward; ZeRO-3 gathers again before the backward."""
    if zero == 2:
        return gather_s, scatter_s
    if zero == 3:
        return gather_s, gather_s + scatter_s
    return 0.0, 0.0


def exposed_s(fwd_comm: float, bwd_comm: float, fwd_compute: float, bwd_compute: float,
              param_overlap: bool, grad_overlap: bool) -> float:
    """Eq. Z4: exposed seconds per micro-batch of one layer's ZeRO-2/3 collectives: with prefetch each pass
    shows only what its collectives take beyond its compute; a runtime that does not overlap shows all."""
    f = max(0.0, fwd_comm - fwd_compute) if param_overlap else fwd_comm
    b = max(0.0, bwd_comm - bwd_compute) if grad_overlap else bwd_comm
    return f + b


def gathered_bytes(zero: int, layer_params: float, param_bytes: float, grad_bytes: float) -> float:
    """Eq. Z5: transient bytes per GPU of a ZeRO-3 stage: the gathered 16-bit parameters of two layers (the
    one computing and the one prefetched) and one layer's unsharded gradients before their reduce-scatter.
    ``layer_params``: one decoder layer's parameters on one GPU before sharding (after tp / ep)."""
    if zero != 3:
        return 0.0
    return layer_params * (2 * param_bytes + grad_bytes)
