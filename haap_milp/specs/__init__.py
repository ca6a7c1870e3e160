"""The vocabulary of haap: what goes in (model, cluster, training) and what comes out (plans).

Every model here is a frozen pydantic v2 model with ``extra="forbid"``; units are in
field names. Bandwidths named ``*_gbps`` are **gigabytes** per second (GB/s, 1e9 bytes/s),
never gigabits: a 200 Gb/s HDR InfiniBand port is ``25`` here. Memory sizes named
``*_gib`` are binary (2**30 bytes); HBM capacities sold as "80 GB" are 80 GiB parts.

All validation of user input happens here (docs/DESIGN.md, step 1); nothing downstream
re-validates. Validators raise ``ValueError`` with the value quoted; the loaders turn
``pydantic.ValidationError`` into ``HaapInputError`` naming the field.
"""

from __future__ import annotations

from haap_milp.pipeline import GIB
from haap_milp.specs.base import (
    FP32_PRECISIONS,
    Activation,
    Engine,
    Frozen,
    MoeLayerPattern,
    NicType,
    Normalization,
    PositionEmbedding,
    Precision,
    Recompute,
    Schedule,
    SolverName,
    Target,
    UniformDim,
)
from haap_milp.specs.cluster import ClusterSpec, GPUSpec, IslandLink, NodeGroup
from haap_milp.specs.model import ModelSpec
from haap_milp.specs.plan import Plan, Replica, StagePlan, Status, Violation
from haap_milp.specs.solve import SolveOptions, SolveResult, relative_gap
from haap_milp.specs.training import TrainingSpec

__all__ = [
    "FP32_PRECISIONS",
    "GIB",
    "Activation",
    "ClusterSpec",
    "Engine",
    "Frozen",
    "GPUSpec",
    "IslandLink",
    "ModelSpec",
    "MoeLayerPattern",
    "NicType",
    "NodeGroup",
    "Normalization",
    "Plan",
    "PositionEmbedding",
    "Precision",
    "Recompute",
    "Replica",
    "Schedule",
    "SolveOptions",
    "SolveResult",
    "SolverName",
    "StagePlan",
    "Status",
    "Target",
    "TrainingSpec",
    "UniformDim",
    "Violation",
    "relative_gap",
]
