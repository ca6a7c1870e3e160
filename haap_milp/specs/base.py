"""Shared base of every spec (frozen, extra=forbid) and the vocabulary's literal types.

Units and conventions: see ``haap_milp.specs`` (the package docstring)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from haap_milp.methods import SOLVER_NAMES
from haap_milp.targets import TARGET_NAMES

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
FP32_PRECISIONS = ("fp32", "tf32")
Engine = Literal["megatron", "deepspeed", "fsdp"]
UniformDim = Literal["tp", "dp", "mbs", "recompute", "ep"]
Recompute = Literal["none", "selective", "full", "op"]
Activation = Literal["gelu", "swiglu", "relu"]
Normalization = Literal["rmsnorm", "layernorm"]
PositionEmbedding = Literal["rope", "learned", "none"]
NicType = Literal["ib", "roce", "ethernet"]
MoeLayerPattern = Literal["all", "every_k", "first_k_dense"]
Schedule = Literal["1f1b", "interleaved", "gpipe"]
Target = Literal[TARGET_NAMES]  # the target registry (targets.py)
SolverName = Literal[SOLVER_NAMES]  # the method registry (methods.py)



class Frozen(BaseModel):
    """Base: immutable, hashable, rejects unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: object) -> object:
        """Accept our own JSON back: derived (computed) fields are recomputed, not read."""
        if isinstance(data, dict) and cls.model_computed_fields:
            data = {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data
