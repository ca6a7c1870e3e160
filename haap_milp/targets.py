"""Target engines: what each can run, declared once (``EngineCapabilities``), and the registry.

Presolve (which plans to enumerate) and the checker read these capabilities; nobody compares target
names. This module imports nothing from haap_milp, so specs, presolve and check import it without
loading any emitter; the emitters (``emit/<name>.py``, found through ``module``) import from here,
never the other way round.

A new target = its emitter module (``emit(plan, cluster, model, training)``, ``plan_violations(plan,
model)`` and ``CAPABILITIES = TARGETS["<name>"]``) + one ``EngineCapabilities`` line below.
"""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.errors import HaapInputError


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can run: the plan space presolve enumerates for it (formulations/: eqs. U1, U2)."""

    name: str
    module: str | None  # the emitter module (emit/...); None: no engine, no launch files
    description: str
    uniform_stages: bool = False  # one (tp, dp, recompute, ep) on every stage (eq. U1)
    same_tp_first_last_when_tied: bool = False  # tied embeddings: first and last stage the same tp (eq. U2)
    recompute_modes: tuple[str, ...] | None = None  # per-stage recompute modes it can mix (None: all)
    selective_runs_as: str | None = None  # the haap mode its selective checkpointing is (None: Megatron's modules)
    max_stages_when_tied: int | None = None  # pipeline stages with tied embeddings (None: no limit)
    mixed_stages: bool = False  # a stage's data-parallel replicas may differ in GPU type and tp (eq. H1)
    mixed_stages_why: str = ""  # why it cannot (the refusal's reason)
    interleave: bool = False  # interleaved 1F1B with vpp > 1 model chunks per stage (eqs. I1-I5)
    context_parallel: bool = True  # cp > 1 (eq. CP1)
    expert_tensor_parallel: bool = True  # etp > 1 (eq. CP4)
    #: ZeRO stages a stage may run (formulations/ eq. Z1), in a plan of several pipeline stages / of one stage
    #: (None: the same); intersected with the runtime's (estimator/runtime.py ``zero_stages``)
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    zero_stages_single: tuple[int, ...] | None = None
    zero_why: str = ""  # why the others cannot run (the refusal's reason)
    zero_per_stage: bool = True  # False: one ZeRO stage for the whole plan on a non-uniform engine (not searched)

    def zero_allowed(self, single_stage: bool) -> tuple[int, ...]:
        """ZeRO stages this engine runs in a plan of one pipeline stage (``single_stage``) or of several."""
        return self.zero_stages_single if single_stage and self.zero_stages_single is not None else self.zero_stages


class EmitError(HaapInputError):
    """The target engine cannot run this plan (the message names the feature and a target that can)."""


TARGETS: dict[str, EngineCapabilities] = {c.name: c for c in (
    EngineCapabilities("any", None, "any plan (no engine restriction)", mixed_stages=True, interleave=True),
    EngineCapabilities("megatron", "haap_milp.emit.megatron", "Megatron-LM: one tp/dp/recompute/ep, any layer split",
                       uniform_stages=True, interleave=True, recompute_modes=("none", "selective", "full"), zero_stages=(0, 1), zero_why="haap emits Megatron-Core's DDP and its "
                       "distributed optimizer (ZeRO-1, --use-distributed-optimizer); ZeRO-2/3 would need Megatron-FSDP "
                       "(--use-megatron-fsdp), which haap neither prices nor emits",
                       mixed_stages_why="Megatron-LM builds one data-parallel group size and one "
                       "micro-batch size for every rank (parallel_state.initialize_model_parallel, "
                       "--micro-batch-size), so replicas cannot differ in tp or share of a micro-batch"),
    EngineCapabilities("flagscale", "haap_milp.emit.flagscale", "FlagScale heterogeneous meshes: per-stage tp/dp",
                       same_tp_first_last_when_tied=True, recompute_modes=("none", "full"), zero_stages=(0, 1),
                       zero_per_stage=False, zero_why="FlagScale sets one use_distributed_optimizer (ZeRO-1) for all "
                       "its process meshes, so the ZeRO stage is the runtime's (--dist-opt / --no-dist-opt), not "
                       "searched per stage",
                       mixed_stages_why="a FlagScale process mesh (flagscale/train/arguments.py: "
                       "hetero_process_meshes, one entry of hetero_device_types) has one device type and one (tp, dp) and the meshes follow one another "
                       "along the pipeline (hetero_pipeline_layer_split), so one stage cannot hold replicas of two "
                       "device types",
                       context_parallel=False),  # emit/flagscale.py refuses cp > 1 (flagscale.cp)
    EngineCapabilities("torchtitan", "haap_milp.emit.torchtitan", "torchtitan: one device mesh, any layer split",
                       uniform_stages=True, max_stages_when_tied=1, zero_stages=(0, 1), zero_stages_single=(0, 2, 3),
                       # its SelectiveAC is op-level SAC (torchtitan 0.3.0 distributed/activation_checkpoint.py)
                       selective_runs_as="op", recompute_modes=("none", "op", "full"),
                       zero_why="with pipeline parallelism torch.distributed.pipelining runs FSDP without gradient sync "
                       "and without resharding until the last backward (stage.py backward_maybe_with_nosync), which is "
                       "ZeRO-1 (data_parallel_shard_degree under pp > 1); ZeRO-2/3 (fsdp_reshard_after_forward never / "
                       "always) run in a single-stage plan, and ZeRO-1 there would run as ZeRO-3",
                       mixed_stages_why="torchtitan builds one "
                       "DeviceMesh of equal dimensions for all ranks (its ParallelDims), so replicas "
                       "cannot differ in tp or share of a batch",
                       expert_tensor_parallel=False),  # emit/torchtitan.py refuses etp > 1 (torchtitan.etp)
)}
TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)  # for Literal[TARGET_NAMES]
ENGINES: tuple[str, ...] = tuple(n for n, c in TARGETS.items() if c.module is not None)  # targets with an emitter


def capabilities(target: str | None) -> EngineCapabilities:
    """The capabilities of a target name (None means "any")."""
    caps = TARGETS.get("any" if target is None else target)
    if caps is None:
        raise HaapInputError(f"unknown target {target!r}; use one of {', '.join(TARGET_NAMES)}", field="target",
                             value=target)
    return caps


__all__ = ["ENGINES", "TARGETS", "TARGET_NAMES", "EmitError", "EngineCapabilities", "capabilities"]
