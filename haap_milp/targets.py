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
    max_stages_when_tied: int | None = None  # pipeline stages with tied embeddings (None: no limit)
    mixed_stages: bool = False  # a stage's data-parallel replicas may differ in GPU type and tp (eq. H1)
    mixed_stages_why: str = ""  # why it cannot (the refusal's reason)
    context_parallel: bool = True  # cp > 1 (eq. CP1)
    expert_tensor_parallel: bool = True  # etp > 1 (eq. CP4)


class EmitError(HaapInputError):
    """The target engine cannot run this plan (the message names the feature and a target that can)."""


TARGETS: dict[str, EngineCapabilities] = {c.name: c for c in (
    EngineCapabilities("any", None, "any plan (no engine restriction)", mixed_stages=True),
    EngineCapabilities("megatron", "haap_milp.emit.megatron", "Megatron-LM: one tp/dp/recompute/ep, any layer split",
                       uniform_stages=True, mixed_stages_why="Megatron-LM builds one data-parallel group size and one "
                       "micro-batch size for every rank (parallel_state.initialize_model_parallel, "
                       "--micro-batch-size), so replicas cannot differ in tp or share of a micro-batch"),
    EngineCapabilities("flagscale", "haap_milp.emit.flagscale", "FlagScale heterogeneous meshes: per-stage tp/dp",
                       same_tp_first_last_when_tied=True, recompute_modes=("none", "full"),
                       mixed_stages_why="a FlagScale process mesh (flagscale/train/arguments.py: "
                       "hetero_process_meshes, one entry of hetero_device_types) has one device type and one (tp, dp) and the meshes follow one another "
                       "along the pipeline (hetero_pipeline_layer_split), so one stage cannot hold replicas of two "
                       "device types",
                       context_parallel=False),  # emit/flagscale.py refuses cp > 1 (flagscale.cp)
    EngineCapabilities("torchtitan", "haap_milp.emit.torchtitan", "torchtitan: one device mesh, any layer split",
                       uniform_stages=True, max_stages_when_tied=1, mixed_stages_why="torchtitan builds one "
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
