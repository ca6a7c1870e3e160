"""Shared base of every spec (frozen, extra=forbid) and the vocabulary's literal types.

Units and conventions: see ``haap_milp.specs`` (the package docstring)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

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


def _one_line(text: str) -> str:
    """A name emit writes into shell scripts, Python and YAML (comments, docstrings, host names): a newline in it
    would end the comment and run the rest as code, so it is one line of printable characters."""
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise ValueError(f"a name must be one line of printable characters; it holds {bad!r}")
    return text


Name = Annotated[str, AfterValidator(_one_line)]  # model, cluster, GPU and island names



BOOL_NOT_NUMBER = "bool_not_number"  # pydantic error type of a true/false given for a number
_NUMBER_FIELDS: dict[type, frozenset[str]] = {}  # per spec class: fields typed int/float (not bool)


def _number_fields(cls: type[BaseModel]) -> frozenset[str]:
    names = _NUMBER_FIELDS.get(cls)
    if names is None:
        def numeric(tp: Any) -> bool:
            args = get_args(tp) or (tp,)
            return bool not in args and any(a in (int, float) for a in args)
        names = frozenset(n for n, f in cls.model_fields.items() if numeric(f.annotation))
        _NUMBER_FIELDS[cls] = names
    return names


class Frozen(BaseModel):
    """Base: immutable, hashable, rejects unknown keys."""

    # defer_build: a model's validator is built on its first use, not when its module is imported (every command
    # imports every spec and uses a few; the same for the network and profile models). Measured on Sailor's 32+96 row
    # in a slow window, 6 runs each in turn: 3.09 -> 2.97 s median end to end; a later 3-run check fell within the VM's
    # spread (2.54 against 2.75 s with profiles, 2.55 against 2.32 s without)
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: object) -> object:
        """Accept our own JSON back: derived (computed) fields are recomputed, not read."""
        if isinstance(data, dict) and cls.model_computed_fields:
            data = {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: object) -> object:
        """``num_layers: true`` is a typo, not 1: pydantic's lax mode would read true/false as 1/0."""
        if isinstance(data, dict):
            for name in _number_fields(cls):
                if isinstance(data.get(name), bool):  # type read by catalog/validation.describe_error
                    raise PydanticCustomError(BOOL_NOT_NUMBER, "field '{field}' is {value}; give a number (true/false "
                                              "is not one)", {"field": name, "value": str(data[name]).lower()})
        return data
