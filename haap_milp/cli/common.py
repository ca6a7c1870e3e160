"""Shared CLI helpers: consoles, JSON output, the one-paragraph error."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, NoReturn

from rich.console import Console

from haap_milp.errors import HaapInputError

console = Console()
err_console = Console(stderr=True)


def fail(message: str) -> NoReturn:
    """Print one paragraph to stderr and exit with code 2 (user error)."""
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise SystemExit(2)


def print_json(obj: Any) -> None:
    """JSON to stdout, stable key order, no rich markup."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_default) + "\n")


def _default(o: Any) -> Any:
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "value"):
        return o.value
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ----------------------------------------------------------------------------- user errors in flag terms

#: spec field -> the command-line flag that sets it (pydantic errors name the flag, not the field)
FLAG_OF_FIELD = {
    "global_batch_size": "--gbs", "seq_len": "--seq", "precision": "--precision",
    "sequence_parallel": "--sp/--no-sp", "distributed_optimizer": "--dist-opt/--no-dist-opt",
    "memory_headroom_fraction": "--memory-headroom", "solver": "--solver", "time_limit_s": "--time-limit",
    "threads": "--threads", "seed": "--seed", "relative_gap": "--gap", "target": "--target",
    "max_stages": "--max-stages",
    # the training runtime (cli/runtime_opts.py)
    "engine": "--engine", "zero_stage": "--zero-stage", "optimizer_state_bytes_per_param": "--opt-state-bytes",
    "grad_reduce_overlap": "--grad-overlap", "param_gather_overlap": "--param-overlap",
    "grad_bucket_bytes": "--grad-bucket", "recompute_modes": "--recompute", "micro_batch_size": "--mbs",
    "uniform": "--uniform",
}


def flag_error(exc: Any, given: dict[str, Any] | None = None) -> HaapInputError:
    """A pydantic ``ValidationError`` from options as one paragraph naming each flag and the value as typed
    (``given``: flag -> the user's value), without pydantic's type codes or URL."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = err.get("loc") or ("",)
        field = str(loc[0])
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        msg = msg.replace("Input should be", "must be").replace("input should be", "must be")
        if not field:  # a rule across several options (a model-level check): its message names them
            parts.append(msg)
            continue
        flag = FLAG_OF_FIELD.get(field, f"--{field.replace('_', '-')}")
        value = (given or {}).get(flag, err.get("input"))
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        parts.append(f"{flag} {shown}: {msg}")
    first = (exc.errors(include_url=False) or [{}])[0]
    return HaapInputError("; ".join(parts) + ".", field=str((first.get("loc") or ("",))[0]) or None,
                          value=first.get("input"))


def finite(value: float, flag: str, lo: float | None = None, hi: float | None = None) -> float:
    """``value`` from a float flag, refusing NaN and infinities (and outside [lo, hi]) by the flag's name."""
    if not math.isfinite(value):
        raise HaapInputError(f"{flag} {value!r}: give a finite number.", field=flag.lstrip("-"), value=value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else \
            (f"at least {lo:g}" if lo is not None else f"at most {hi:g}")
        raise HaapInputError(f"{flag} {value:g}: must be {rng}.", field=flag.lstrip("-"), value=value)
    return value


#: Default of --memory-headroom: TrainingSpec's default (kept so plans stay as they were; README "Memory headroom").
DEFAULT_HEADROOM = 0.05
HEADROOM_HELP = ("Fraction of each GPU's memory kept free, e.g. 0.2 or 20% (default 0.05). The memory model omits "
                 "allocator fragmentation beyond a 3 GiB reserve: on torchtitan FSDP runs it under-predicts "
                 "measured peaks by 15-23%, while on Megatron-style runs it already over-predicts (7 of 38 "
                 "published runs that ran are predicted not to fit). 0.05 keeps plans as published; use 0.2 "
                 "when the target is torchtitan or no measured peak is at hand.")


def parse_headroom(text: str | None) -> float:
    """--memory-headroom: a fraction in [0, MAX_HEADROOM_FRACTION] ('0.2') or a percentage ('20%')."""
    from haap_milp.specs.training import MAX_HEADROOM_FRACTION

    if text is None:
        return DEFAULT_HEADROOM
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise HaapInputError(f"--memory-headroom {text!r}: give a fraction such as 0.2 or a percentage such as "
                             "20%.", field="memory_headroom_fraction", value=text) from None
    if not math.isfinite(value) or not 0 <= value <= MAX_HEADROOM_FRACTION:  # (the spec's bound, in its words)
        raise HaapInputError(f"--memory-headroom {text!r}: must be a fraction between 0 and {MAX_HEADROOM_FRACTION:g} "
                             f"(0% to {MAX_HEADROOM_FRACTION:.0%}).", field="memory_headroom_fraction", value=text)
    return value


def enforce_plan(plan: Any, model: Any, cluster: Any, training: Any, *, what: str, target: str = "any",
                 memory: bool = True, estimator: Any = None) -> None:
    """The checker's rules (check.check_plan) on a user's plan: a broken rule is one paragraph, exit 2."""
    from haap_milp.check import check_plan
    from haap_milp.errors import PlanInvalidError

    viol = check_plan(plan, model, cluster, training, target=target, memory=memory, estimator=estimator)
    if viol:
        shown = "; ".join(str(v) for v in viol[:4]) + (f"; and {len(viol) - 4} more" if len(viol) > 4 else "")
        raise PlanInvalidError(f"{what} breaks {len(viol)} rule{'s' if len(viol) > 1 else ''} of the checker "
                               f"(model {model.name}, cluster {cluster.name}): {shown}.",
                               field=viol[0].rule, value=viol[0].stage)
