"""Plan files: what `solve --json FILE` writes and `estimate/simulate/emit --plan` read.

A plan file is JSON with a ``plan`` key (a ``Plan``) and, when written by haap, the full
``model``, ``cluster`` and ``training`` specs so it is self-contained. A bare ``Plan`` JSON is
accepted too; then model and cluster come from the command line.
"""

from __future__ import annotations

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


def _field_path(exc: ValidationError, section: str = "") -> str:
    """The first error, its field named as the file spells it (``section``: the key it sits under, e.g. training)."""
    from haap_milp.catalog.files import short
    from haap_milp.specs.base import BOOL_NOT_NUMBER

    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(x) for x in (section, *err["loc"]) if str(x)) or "(top level)"
    if err.get("type") == BOOL_NOT_NUMBER:  # raised on the stage/plan: the field is in the context
        ctx = err.get("ctx") or {}
        where = ".".join(str(x) for x in (section, *err["loc"], ctx.get("field", "")) if str(x))
        return f"field {where} is {ctx.get('value')}; give a number (true/false is not one)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"field {loc}: {msg} (got {short(err.get('input'), 80)})"


def _named(doc: dict, body: dict, key: str, path: str):
    """The model/cluster a plan file names as text (top-level ``model: llama3-8b`` or the plan's own
    ``model``/``cluster`` field) when it is a catalog name or a cluster shorthand; else None."""
    from haap_milp.catalog import data as cat
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.catalog.shorthand import looks_like_shorthand

    explicit = body is not doc and isinstance(doc.get(key), str)  # a top-level name beside the plan
    text = doc.get(key) if explicit else body.get(key)
    if not isinstance(text, str) or not text.strip():
        return None
    if key == "model":
        return load_model(text) if cat.model_entry(text) is not None or explicit else None
    if cat.canonical("cluster", text) is not None or looks_like_shorthand(text) or explicit:
        try:
            return load_cluster(text)
        except HaapInputError as exc:
            if explicit:
                raise HaapInputError(f"plan file {path!r}: field 'cluster' = {text!r}: {exc}", field="cluster",
                                     value=text) from None
            return None
    return None


def _same_model(named: str, embedded: str) -> bool:
    """Whether a plan's model name and the file's embedded model name the same model (a catalog alias counts; an empty
    name, a display field, claims nothing)."""
    from haap_milp.catalog import data as cat

    return not named or named == embedded or (cat.canonical("model", named) or named) == (
        cat.canonical("model", embedded) or embedded)


def read_plan_file(path: str | Path) -> PlanFile:
    """Parse a plan file; every problem becomes one HaapInputError paragraph."""
    from haap_milp.catalog.files import parse_text, read_text

    name = str(path)
    doc = parse_text(read_text(name, "plan file"), name, "json")
    if not isinstance(doc, dict):
        raise HaapInputError(f"plan file {name!r} must hold a JSON object, got {type(doc).__name__}",
                             field="plan", value=name)
    body = doc.get("plan", doc) if isinstance(doc.get("plan"), dict) or "stages" not in doc else doc
    if body is None:
        raise HaapInputError(f"plan file {name!r} has no plan (status {doc.get('status')!r})", field="plan")
    if body is doc and "stages" not in doc:  # (neither a result with a 'plan' nor a bare plan with 'stages')
        raise HaapInputError(f"plan file {name!r} has neither a 'plan' key (a result written by `solve --json`) nor "
                             "'stages' (a bare plan); it holds " + ", ".join(repr(k) for k in list(doc)[:8]),
                             field="plan")
    if body is not doc:
        _check_section_types(doc, name)
    section = "plan" if body is not doc else ""
    try:
        plan = Plan.model_validate(body)
        parts = {}
        for section, cls in (("model", ModelSpec), ("cluster", ClusterSpec), ("training", TrainingSpec)):
            if isinstance(doc.get(section), dict):
                parts[section] = cls.model_validate(doc[section])
    except ValidationError as exc:
        raise HaapInputError(f"plan file {name!r}: {_field_path(exc, section)}") from None
    except RecursionError:
        raise HaapInputError(f"plan file {name!r} is nested too deeply to be a plan.", field="plan") from None
    for key in ("model", "cluster"):
        if key not in parts and isinstance(body, dict):
            found = _named(doc, body, key, name)
            if found is not None:
                parts[key] = found
    _check_agrees(plan, parts, isinstance(doc.get("model"), dict), name)
    return PlanFile(plan, parts.get("model"), parts.get("cluster"), parts.get("training"))


def _check_section_types(doc: dict, name: str) -> None:
    """A result's model/cluster (a mapping or a name) and training (a mapping) beside its plan."""
    from haap_milp.catalog.files import short

    for key, kinds, what in (("model", (dict, str), "a model mapping or a catalog model name"),
                             ("cluster", (dict, str), "a cluster mapping, a catalog name or a shorthand"),
                             ("training", (dict,), "a training mapping (haap-solve schema training)")):
        if doc.get(key) is not None and not isinstance(doc[key], kinds):
            raise HaapInputError(f"plan file {name!r}: field {key!r} must be {what}, got "
                                 f"{type(doc[key]).__name__} {short(doc[key], 60)}", field=key, value=doc[key])


def _check_agrees(plan: Plan, parts: dict, model_embedded: bool, name: str) -> None:
    """The plan against the file's embedded model (which is priced) and training block (whose values the plan's
    would otherwise win over silently)."""
    model, training = parts.get("model"), parts.get("training")
    if model_embedded and not _same_model(plan.model, model.name):
        raise HaapInputError(f"plan file {name!r}: the plan says model {plan.model!r} but the file's model is "
                             f"{model.name!r}; a plan's stages are for one model, so fix the one that is wrong",
                             field="model", value=plan.model)
    for field in ("global_batch_size", "seq_len", "precision") if training is not None else ():
        if getattr(plan, field) != getattr(training, field):
            raise HaapInputError(f"plan file {name!r}: plan.{field} is {getattr(plan, field)!r} but "
                                 f"training.{field} is {getattr(training, field)!r}; the plan was made for one "
                                 "training setup, so fix the one that is wrong", field=f"plan.{field}",
                                 value=getattr(plan, field))


def solution_document(result, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, metrics: dict,
                      search: dict | None = None) -> dict:
    """The JSON written by `solve --json`: headline numbers first, then the plan and the inputs. ``search``:
    presolve.presolve_document (``excluded`` GPUs and profile points, ``profile``), placed after ``stats``."""
    doc = {
        "status": result.status.value,
        "solver": result.solver,
        **metrics,
        "bound_s": result.bound_s,
        "gap": result.gap,
        "wall_time_s": result.wall_time_s,
        "message": result.message,
        "stats": result.stats,
        **(search or {}),
        "plan": None,
    }
    if result.plan is not None:
        plan = result.plan.model_dump(mode="json")
        doc["plan"] = plan
        if result.plan.vpp > 1:  # eqs. I1-I5: the per-virtual-stage layout the plan implies
            doc["interleaving"] = virtual_layout(result.plan)
    doc.update(model=model.model_dump(mode="json"), cluster=cluster.model_dump(mode="json"),
               training=training.model_dump(mode="json"))
    return doc


def virtual_layout(plan) -> dict:
    """The interleaved plan's virtual stages in execution order (virtual stage k = chunk c of stage j, k = c*P + j):
    each with its stage, chunk and decoder layers [first, last) (``interleave.chunk_layers``: a stage's layers
    split as evenly as possible, earlier chunks taking the remainder; Megatron's layout places chunk c of every
    stage before chunk c + 1 of any, so layer ranges follow virtual-stage order)."""
    from haap_milp.interleave import chunk_layers

    p, v = plan.pp, plan.vpp
    sizes = [chunk_layers(st.num_layers, v) for st in plan.stages]
    out, first = [], 0
    for c in range(v):
        for j in range(p):
            out.append({"virtual_stage": c * p + j, "stage": j, "chunk": c, "layers": [first, first + sizes[j][c]]})
            first += sizes[j][c]
    return {"vpp": v, "layers_per_chunk": sizes, "virtual_stages": out}
