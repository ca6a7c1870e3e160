"""Plan files: what `solve --json FILE` writes and `estimate/simulate/emit --plan` read.

A plan file is JSON with a ``plan`` key (a ``Plan``) and, when written by haap, the full
``model``, ``cluster`` and ``training`` specs so it is self-contained. A bare ``Plan`` JSON is
accepted too; then model and cluster come from the command line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from haap_milp.errors import HaapInputError
from haap_milp.specs import ClusterSpec, ModelSpec, Plan, TrainingSpec


@dataclass(frozen=True)
class PlanFile:
    plan: Plan
    model: ModelSpec | None = None
    cluster: ClusterSpec | None = None
    training: TrainingSpec | None = None


def _field_path(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
    return f"field {loc}: {err['msg']} (got {err.get('input')!r:.80})"


def read_plan_file(path: str | Path) -> PlanFile:
    """Parse a plan file; every problem becomes one HaapInputError paragraph."""
    p = Path(path)
    if not p.is_file():
        raise HaapInputError(f"plan file {str(path)!r} does not exist or is not a file", field="plan", value=str(path))
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HaapInputError(f"plan file {str(path)!r} is not UTF-8 JSON: {exc}", field="plan", value=str(path)) from None
    if not isinstance(doc, dict):
        raise HaapInputError(f"plan file {str(path)!r} must hold a JSON object, got {type(doc).__name__}")
    body = doc.get("plan", doc) if isinstance(doc.get("plan"), dict) or "stages" not in doc else doc
    if body is None:
        raise HaapInputError(f"plan file {str(path)!r} has no plan (status {doc.get('status')!r})", field="plan")
    try:
        plan = Plan.model_validate(body)
        parts = {k: cls.model_validate(doc[k]) for k, cls in
                 (("model", ModelSpec), ("cluster", ClusterSpec), ("training", TrainingSpec)) if isinstance(doc.get(k), dict)}
    except ValidationError as exc:
        raise HaapInputError(f"plan file {str(path)!r}: {_field_path(exc)}") from None
    return PlanFile(plan, parts.get("model"), parts.get("cluster"), parts.get("training"))


def solution_document(result, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, metrics: dict) -> dict:
    """The JSON written by `solve --json`: headline numbers first, then the plan and the inputs."""
    doc = {
        "status": result.status.value,
        "solver": result.solver,
        **metrics,
        "bound_s": result.bound_s,
        "gap": result.gap,
        "wall_time_s": result.wall_time_s,
        "message": result.message,
        "stats": result.stats,
        "plan": None,
    }
    if result.plan is not None:
        plan = result.plan.model_dump(mode="json")
        doc["plan"] = plan
    doc.update(model=model.model_dump(mode="json"), cluster=cluster.model_dump(mode="json"),
               training=training.model_dump(mode="json"))
    return doc
