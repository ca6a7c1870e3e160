"""The training runtime on the command line: ``--training FILE`` and the flags that override it (solve, compare,
estimate). Precedence: TrainingSpec defaults < the file < flags. README "Training runtime"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from haap_milp.catalog.files import is_file, load_data, require_mapping
from haap_milp.catalog.validation import validate_spec
from haap_milp.cli.common import finite, flag_error
from haap_milp.errors import HaapInputError
from haap_milp.specs import TrainingSpec
from haap_milp.specs.training import megatron_cannot_shard

Opt = typer.Option

PRECISION_HELP = ("fp32 | tf32 | bf16 | fp16 | fp8. fp32 and tf32 move 4-byte activations, gradients and messages; "
                  "fp32 GEMMs run on TF32 tensor cores where the GPU has them, else on CUDA cores (V100); tf32 needs "
                  "tensor cores.")
TrainingFileOpt = Annotated[str | None, Opt("--training", help="Training YAML (`haap-solve schema training`); flags "
                                            "override its values.")]
EngineOpt = Annotated[str | None, Opt("--engine", help="megatron | deepspeed | fsdp: presets the overlap, ZeRO stage "
                                      "and buckets of that runtime (README 'Training runtime'; default megatron).")]
ZeroOpt = Annotated[int | None, Opt("--zero-stage", help="ZeRO stage 0-3 (0 plain data parallel, 1 sharded optimizer, "
                                    "2 + gradients, 3 + weights); default: the engine's.")]
ZeroSearchOpt = Annotated[str | None, Opt("--zero", help="ZeRO stage per pipeline stage, searched: auto (every stage the "
                                          "runtime and --target run), one of 0-3, or a list such as 1,3 (formulations/ "
                                          "eq. Z1). Default: auto under --engine fsdp (eq. D3), else the runtime's one "
                                          "stage, not searched; --zero-stage N fixes one stage. --no-dist-opt means 0 (and, on "
                                          "estimate, --dist-opt 1); a --zero that says otherwise is an error.")]
NoDistOptOpt = Annotated[bool, Opt("--no-dist-opt", help="No distributed optimizer: plain data parallel (ZeRO-0; "
                                  "fsdp: NO_SHARD). Default: on (ZeRO-1).")]
OptStateOpt = Annotated[float | None, Opt("--opt-state-bytes", help="Optimizer bytes per parameter incl. the "
                                          "fp32 master copy (Adam: 12; SGD with momentum: 8).")]
GradOverlapOpt = Annotated[str | None, Opt("--grad-overlap", help="on | off: gradient reduction overlapped with "
                                           "backward; off: all of it after the last backward. Default: the engine's.")]
ParamOverlapOpt = Annotated[str | None, Opt("--param-overlap", help="on | off: parameter all-gather overlapped with "
                                            "compute (distributed optimizer / ZeRO). Default: the engine's.")]
BucketOpt = Annotated[float | None, Opt("--grad-bucket", help="Gradient bucket, bytes (e.g. 5e8); default: the "
                                        "engine's.")]
RecomputeSetOpt = Annotated[str | None, Opt("--recompute", help="Allowed recompute modes, a set: e.g. none or "
                                            "none,selective,full (default: all).")]
MbsOpt = Annotated[int | None, Opt("--mbs", help="Fixed per-replica micro-batch, sequences (default: chosen).")]
UniformOpt = Annotated[str | None, Opt("--uniform", help="Dimensions equal in every stage: any of tp,dp,mbs,ep,"
                                       "recompute (e.g. dp).")]

#: flag -> TrainingSpec field (for one-paragraph errors)
RUNTIME_FLAGS = {"engine": "--engine", "zero_stage": "--zero-stage", "optimizer_state_bytes_per_param":
                 "--opt-state-bytes", "grad_bucket_bytes": "--grad-bucket", "recompute_modes": "--recompute",
                 "micro_batch_size": "--mbs", "uniform": "--uniform"}


@dataclass
class RuntimeFlags:
    """The runtime flags as typed (None: not given)."""

    engine: str | None = None
    zero_stage: int | None = None
    dist_opt: bool | None = None
    optimizer_state_bytes: float | None = None
    grad_overlap: str | None = None  # on | off
    param_overlap: str | None = None
    grad_bucket: float | None = None
    recompute: str | None = None
    mbs: int | None = None
    uniform: str | None = None


def _set(text: str | None, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise HaapInputError(f"{flag} {text!r}: give a comma-separated set of {', '.join(allowed)}.",
                             field=flag.lstrip("-"), value=text)
    return items


def _on_off(text: str | None, flag: str) -> bool | None:
    if text is None:
        return None
    value = {"on": True, "off": False, "true": True, "false": False}.get(text.strip().lower())
    if value is None:
        raise HaapInputError(f"{flag} {text!r}: give on or off.", field=flag.lstrip("-"), value=text)
    return value


def _missing(path: str) -> bool:
    """Nothing at ``path``, or a name the OS refuses (too long, NUL)."""
    try:
        return not Path(path).exists()
    except (OSError, ValueError):
        return True


def load_training(path: str) -> dict[str, Any]:
    """The mapping of a training YAML/JSON file, validated as a whole TrainingSpec (unknown keys: exit 2)."""
    if not is_file(path) and _missing(path):  # (a folder, device or FIFO: read_text says what it is instead)
        raise HaapInputError(f"--training {path!r}: no such file.", field="training", value=path)
    data = require_mapping(load_data(path, "--training"), path, "a training file: TrainingSpec fields (`haap-solve schema "
                           "training`)")
    validate_spec(TrainingSpec, data, f"training file {path!r}")
    return data


def build_training(file: str | None, base: dict[str, Any], flags: RuntimeFlags,
                   start: dict[str, Any] | None = None) -> TrainingSpec:
    """TrainingSpec from defaults < ``start`` (e.g. a plan file's training) < file < flags. ``base``: the
    command's own flags (field -> value; None: not given)."""
    for flag, value in (("--opt-state-bytes", flags.optimizer_state_bytes), ("--grad-bucket", flags.grad_bucket)):
        if value is not None:  # (NaN / inf: the wording of every float flag, not the spec's bound on a NaN)
            finite(value, flag)
    data: dict[str, Any] = {**(start or {}), **(load_training(file) if file else {})}
    upd: dict[str, Any] = {k: v for k, v in base.items() if v is not None}
    recompute = _set(flags.recompute, "--recompute", ("none", "selective", "full", "op"))
    uniform = _set(flags.uniform, "--uniform", ("tp", "dp", "mbs", "recompute", "ep"))
    grad_overlap, param_overlap = _on_off(flags.grad_overlap, "--grad-overlap"), _on_off(flags.param_overlap,
                                                                                          "--param-overlap")
    for field, value in (("engine", flags.engine), ("zero_stage", flags.zero_stage),
                         ("distributed_optimizer", flags.dist_opt),
                         ("optimizer_state_bytes_per_param", flags.optimizer_state_bytes),
                         ("grad_reduce_overlap", grad_overlap), ("param_gather_overlap", param_overlap),
                         ("grad_bucket_bytes", flags.grad_bucket), ("recompute_modes", recompute),
                         ("micro_batch_size", flags.mbs), ("uniform", uniform)):
        if value is not None:
            upd[field] = value
    if flags.zero_stage and flags.dist_opt is False:  # (the spec says so too, in its field names: these are the flags)
        raise HaapInputError(f"--zero-stage {flags.zero_stage} conflicts with --no-dist-opt (plain data parallel, "
                             "ZeRO 0); give one of the two.", field="zero_stage", value=flags.zero_stage)
    engine = upd.get("engine", data.get("engine", TrainingSpec.model_fields["engine"].default))
    if megatron_cannot_shard(engine, flags.zero_stage):  # (TrainingSpec says it too, in its field names)
        via = "--engine megatron" if flags.engine else "the default engine, megatron,"
        raise HaapInputError(f"--zero-stage {flags.zero_stage} with {via} runs ZeRO 0 or 1 only (Megatron-Core DDP and "
                             "--use-distributed-optimizer); give --engine fsdp for ZeRO 2 or 3.", field="zero_stage",
                             value=flags.zero_stage)
    if flags.dist_opt is not None and flags.zero_stage is None:
        upd["zero_stage"] = None  # --dist-opt/--no-dist-opt picks the engine's stage (megatron: 1 / 0)
    try:
        return TrainingSpec(**{**data, **upd})
    except ValidationError as exc:
        given = {RUNTIME_FLAGS.get(k, k): v for k, v in (("engine", flags.engine), ("zero_stage", flags.zero_stage),
                                                         ("grad_bucket_bytes", flags.grad_bucket),
                                                         ("micro_batch_size", flags.mbs))}
        raise flag_error(exc, {k: v for k, v in given.items() if v is not None}) from None


def zero_search(text: str | None, zero_stage: int | None = None, dist_opt: bool | None = None):
    """``--zero`` as SolveOptions.zero: None (not given), "auto" or a tuple of stages. ``--zero-stage`` and
    ``--dist-opt/--no-dist-opt`` fix the runtime's one stage; a ``--zero`` that disagrees with them is an error
    (``--dist-opt`` is ZeRO-1, ``--no-dist-opt`` ZeRO-0)."""
    if text is None:
        return None
    t = text.strip().lower()
    if t == "auto":
        stages = "auto"
    else:
        try:
            stages = tuple(dict.fromkeys(int(x) for x in t.split(",") if x.strip()))
        except ValueError:
            stages = ()
        if not stages or any(z not in (0, 1, 2, 3) for z in stages):
            raise HaapInputError(f"--zero {text!r}: give auto, one ZeRO stage 0-3, or a comma-separated list of them "
                                 "(e.g. 1,3).", field="zero", value=text)
    fixed = [(f"--zero-stage {zero_stage}", zero_stage)] if zero_stage is not None else []
    if dist_opt is not None:
        fixed.append(("--dist-opt" if dist_opt else "--no-dist-opt", 1 if dist_opt else 0))
    for flag, z in fixed:
        if stages != (z,):
            raise HaapInputError(f"--zero {text} conflicts with {flag} (ZeRO {z} on every stage); give one of the two.",
                                 field="zero", value=text)
    return stages
