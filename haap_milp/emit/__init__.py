"""Launch configurations for training engines, from a ``Plan``.

``emit(plan, target, cluster, model, training=None) -> dict[str, str]`` returns file name ->
content. An engine that cannot run the plan is refused with ``EmitError`` naming the feature
and a target that can. Each engine module also exposes ``plan_violations(plan, model)`` (its
argument-validation rules, re-implemented in pure Python) for the checker, and ``CAPABILITIES``,
its entry of the target registry (``haap_milp.targets``: what presolve may plan for it).

Modules: ``megatron`` (Megatron-LM arguments + ``--pipeline-model-parallel-layout``),
``flagscale`` (heterogeneous meshes YAML), ``torchtitan`` (TOML), ``nccl`` (per-island NCCL
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


def emit(plan, target: str, cluster, model, training=None) -> dict[str, str]:
    """Files that launch ``plan`` on ``target`` (file name -> text). Raises EmitError when it cannot."""
    files = engine_module(target).emit(plan, cluster, model, training)
    files.update(nccl.emit_nccl_env(plan, cluster))
    return files


__all__ = ["TARGETS", "EmitError", "emit", "engine_module"]
