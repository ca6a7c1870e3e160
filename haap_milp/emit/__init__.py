"""Launch configurations for training engines, from a ``Plan``.

``emit(plan, target, cluster, model, training=None) -> dict[str, str]`` returns file name ->
content. An engine that cannot run the plan is refused with ``EmitError`` naming the feature
and a target that can. Each engine module also exposes ``plan_violations(plan, model)`` (its
argument-validation rules, re-implemented in pure Python) for the checker, and ``CAPABILITIES``,
its entry of the target registry (``haap_milp.targets``: what presolve may plan for it).

Modules: ``megatron`` (Megatron-LM arguments + ``--pipeline-model-parallel-layout``),
``flagscale`` (heterogeneous meshes YAML), ``torchtitan`` (Python config module; TOML for 0.1),
``torchtitan_models`` (which torchtitan model builds the plan's model, or why none), ``launch``
(LAUNCH.txt: engine version, command, what to supply), ``nccl`` (per-island NCCL
environment for mixed NICs), ``placement`` (rank order: which GPU runs which rank).
"""

from __future__ import annotations

import importlib

from haap_milp import targets
from haap_milp.emit import nccl
from haap_milp.errors import HaapInputError
from haap_milp.targets import EmitError

TARGETS = targets.ENGINES  # the targets with an emitter (names from the registry, haap_milp.targets)


def engine_module(target: str):
    """The emitter module of ``target`` (named in its ``EngineCapabilities``; imported on first use)."""
    caps = targets.TARGETS.get(target)
    if caps is None or caps.module is None:
        raise HaapInputError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}", field="target",
                             value=target)
    return importlib.import_module(caps.module)


def emit(plan, target: str, cluster, model, training=None, engine_version: str | None = None) -> dict[str, str]:
    """Files that launch ``plan`` on ``target`` (file name -> text), ``LAUNCH.txt`` among them (engine version,
    command, what the user supplies). ``engine_version`` picks an older output form where an engine has one
    (torchtitan: ``0.1`` = TOML). Raises EmitError when it cannot."""
    module = engine_module(target)
    caps = targets.TARGETS[target]
    mixed = [j for j, s in enumerate(plan.stages) if s.replicas]
    if mixed and not caps.mixed_stages:  # formulations/ eq. H1; solve with --mixed-stages off or --target
        raise EmitError(f"{target} cannot run stage {mixed[0]}, whose data-parallel replicas differ in GPU type: "
                        f"{caps.mixed_stages_why}. Plan with --target {target} (or --mixed-stages off).",
                        field="plan.stages", value=mixed[0])
    versions = getattr(module, "VERSIONS", None)
    if engine_version is not None and versions is None:
        raise EmitError(f"--engine-version: {target} files follow one version only ({module.ENGINE_VERSION})",
                        field="engine_version", value=engine_version)
    files = (module.emit(plan, cluster, model, training) if engine_version is None
             else module.emit(plan, cluster, model, training, version=engine_version))
    files.update(nccl.emit_nccl_env(plan, cluster))
    return files


def setup_refusals(target: str | None, model, training) -> list:
    """What ``target``'s engine refuses whatever the plan (the model's architecture, the precision): the
    ``Violation`` list of its module's ``setup_refusals`` (none for ``any``). Every plan would fail the checker
    with them, so the planner refuses the problem before solving it (``planner.Context.build``)."""
    caps = targets.TARGETS.get(target or "any")
    if caps is None or caps.module is None:
        return []
    return list(engine_module(target).setup_refusals(model, training))


__all__ = ["TARGETS", "EmitError", "emit", "engine_module", "setup_refusals"]
