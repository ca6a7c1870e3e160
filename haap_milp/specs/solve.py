"""Solver options and the result of a solve.

Units and conventions: see ``haap_milp.specs`` (the package docstring)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from haap_milp.specs.base import (
    Frozen,
    Recompute,
    SolverName,
    Target,
)
from haap_milp.specs.plan import Plan, Status


# The search space of `haap-solve solve` with none of --vpp/--cp/--zero (formulations/ eqs. D1-D3: interleaving, cp
# and ZeRO where they pay), as SolveOptions fields; SolveOptions() itself keeps vpp 1, cp 1 and the runtime's ZeRO
SOLVE_SPACE = {"vpp": "default", "cp": "default", "zero": "default"}


class SolveOptions(Frozen):
    """How to search."""

    solver: SolverName = Field(default="auto", description="auto picks cpsat.")
    time_limit_s: float = Field(default=60.0, description="Wall-clock limit, s: the exact solver's budget; the CLI bounds the whole command with it (deadline.py).", gt=0, le=86_400)
    threads: int = Field(default=2, description="Solver worker threads.", ge=1, le=256)
    seed: int = Field(default=0, description="Random seed (determinism).", ge=0)
    relative_gap: float = Field(default=0.01, description="Stop when (objective - bound)/objective <= this.", ge=0, le=1)
    target: Target = Field(default="any", description="Restrict to plans this engine can run.")
    warm_start: bool = Field(default=True, description="Seed exact solvers with the DP plan.")
    max_stages: int | None = Field(default=None, description="Upper limit on pipeline stages (None: presolve bound).", ge=1)
    micro_batch_sizes: tuple[int, ...] | None = Field(
        default=None, description="Samples per micro-batch to consider (None: presolve picks).")
    recompute: tuple[Recompute, ...] = Field(  # "op" is searched only where the runtime allows it (TrainingSpec)
        default=("none", "selective", "full", "op"), description="Recompute modes the search may use.")
    mixed_stages: Literal["auto", "on", "off"] = Field(
        default="auto", description="Stages whose data-parallel replicas differ in GPU type (formulations/ eqs. "
        "H1-H6); auto: on where the target engine and the runtime can run them.")
    zero: Literal["auto", "default"] | tuple[Literal[0, 1, 2, 3], ...] | None = Field(
        default=None, description="ZeRO stages the search may give each stage (formulations/ eq. Z1): auto = "
        "every stage the runtime and the target engine run; None: the runtime's one stage, not searched; default "
        "(eq. D3, the CLI's when --zero is unset): auto under the fsdp runtime when no ZeRO stage is fixed, else None.")
    vpp: int | Literal["auto", "default"] = Field(
        default=1, description="Interleaved 1F1B (formulations/ eqs. I1-I5): 1 off; N: plans with vpp 1 or "
        "N; auto: vpp 1, 2, 3 or 4 where the target engine interleaves; default (eq. D2, the CLI's when --vpp is "
        "unset): auto only where the 1F1B fill/drain share is material, else 1.")
    cp: Literal["auto", "default"] | int = Field(
        default=1, description="Context-parallel degree (formulations/ eqs. CP1-CP3): a number fixes it, "
        "auto searches every cp with seq_len % (2*cp) == 0 up to 16 (one cp per plan); default (eq. D1, the CLI's "
        "when --cp is unset): auto from seq_len 32768 up, else 1.")
    etp: Literal["auto"] | int = Field(
        default=1, description="Expert-tensor-parallel degree of MoE layers (eq. CP4): a number fixes it, auto "
        "searches the divisors of the expert FFN that fit a node and fold onto the stage (per stage).")

    @field_validator("cp", "etp")
    @classmethod
    def _positive(cls, v, info):
        if v not in ("auto", "default") and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{info.field_name} must be 'auto' or a positive integer, got {v!r}")
        return v


class SolveResult(Frozen):
    """What a solver returns; the plan is decoded and scored by the planner."""

    status: Status
    solver: str
    objective_s: float | None = Field(default=None, description="Predicted iteration time of the plan, s.")
    bound_s: float | None = Field(default=None, description="Proven lower bound on the iteration time, s.")
    gap: float | None = Field(default=None, description="(objective - bound) / objective.")
    wall_time_s: float = Field(default=0.0, description="Solver wall time, s.")
    plan: Plan | None = None
    message: str = Field(default="", description="Why (infeasible reason, time limit, error).")
    stats: dict[str, float | int | str] = Field(default_factory=dict, description="Solver/presolve statistics.")

    @property
    def iteration_time_s(self) -> float | None:
        """The predicted iteration time of the plan, s: the name ``solve --json`` uses (= ``objective_s``)."""
        return self.objective_s


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """(objective - bound) / objective, clipped at 0; None when either is unknown."""
    if objective is None or bound is None or objective <= 0 or not math.isfinite(objective):
        return None
    return max(0.0, (objective - bound) / objective)
