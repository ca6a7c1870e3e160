"""Launch configurations for training engines, from a ``Plan``.

``emit(plan, target, cluster, model, training=None) -> dict[str, str]`` returns file name ->
content. An engine that cannot run the plan is refused with ``EmitError`` naming the feature
and a target that can. Each engine module also exposes ``plan_violations(plan, model)`` (its
argument-validation rules, re-implemented in pure Python) for the checker.

Modules: ``megatron`` (Megatron-LM arguments + ``--pipeline-model-parallel-layout``),
``flagscale`` (heterogeneous meshes YAML), ``torchtitan`` (TOML), ``nccl`` (per-island NCCL
environment for mixed NICs), ``placement`` (rank order: which GPU runs which rank).
"""

from __future__ import annotations

from haap_milp.errors import HaapInputError

TARGETS = ("megatron", "flagscale", "torchtitan")


class EmitError(HaapInputError):
    """The target engine cannot run this plan (the message names the feature and a target that can)."""


def engine_module(target: str):
    """The module implementing ``target`` (late import: the engine modules import EmitError from here)."""
    if target == "megatron":
        from haap_milp.emit import megatron as mod
    elif target == "flagscale":
        from haap_milp.emit import flagscale as mod
    elif target == "torchtitan":
        from haap_milp.emit import torchtitan as mod
    else:
        raise HaapInputError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}", field="target",
                             value=target)
    return mod


def emit(plan, target: str, cluster, model, training=None) -> dict[str, str]:
    """Files that launch ``plan`` on ``target`` (file name -> text). Raises EmitError when it cannot."""
    from haap_milp.emit import nccl

    files = engine_module(target).emit(plan, cluster, model, training)
    files.update(nccl.emit_nccl_env(plan, cluster))
    return files


__all__ = ["TARGETS", "EmitError", "emit", "engine_module"]
