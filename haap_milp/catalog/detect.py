"""What is this file? Model (YAML or HF config), cluster, training, plan, solve result, network, profile or prices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from haap_milp.catalog import data as cat
from haap_milp.catalog.cluster_file import preset_cluster
from haap_milp.catalog.files import is_dir, is_file, load_data, looks_like_path, path_exists, require_mapping, short
from haap_milp.catalog.loaders import (
    cluster_from_file_data,
    detect_kind,
    display_name,
    model_from_data,
    spec_from_data,
)
from haap_milp.catalog.shorthand import looks_like_shorthand, parse_shorthand
from haap_milp.catalog.validation import suggest
from haap_milp.errors import HaapInputError
from haap_milp.specs import Plan, SolveResult, TrainingSpec


def load_file(path: str) -> tuple[str, Any]:
    """(kind, validated object) for any input file haap reads; errors are one paragraph."""
    p = Path(path)
    if is_dir(p) and is_file(p / "config.json"):
        p = p / "config.json"
    elif is_dir(p) and _metis_folder(p):  # a Metis profile folder (--profile takes it)
        from haap_milp.estimator.profile_format import load_profiles

        return "profile", load_profiles([p])
    name = str(p)
    data = require_mapping(load_data(p), name, "a model, cluster, training, plan, result, network, profile or prices "
                                                "file")
    kind = detect_kind(data)
    if kind == "model":
        return kind, model_from_data(data, display_name(p), f"model file {name!r}", name)
    if kind == "cluster":
        return kind, cluster_from_file_data(data, name)
    if kind == "plan":
        return kind, spec_from_data(Plan, data, f"plan file {name!r}")
    if kind == "result":
        return kind, spec_from_data(SolveResult, _result_fields(data), f"result file {name!r}")
    if kind == "training":
        return kind, spec_from_data(TrainingSpec, data, f"training file {name!r}")
    if kind == "network":
        from haap_milp.network.merge import load_network

        return kind, load_network(name, "network file")
    if kind == "profile":
        from haap_milp.estimator.profile_format import load_profiles

        return kind, load_profiles([name])
    if kind == "prices":
        from haap_milp.catalog.prices import load_prices

        return kind, load_prices(name)
    keys = ", ".join(short(k, 30) for k in sorted(data)[:8]) or "no keys"
    raise HaapInputError(
        f"cannot tell what {name!r} describes (keys: {keys}): a model has num_layers/hidden (or is a HF config.json "
        "with 'architectures'), a cluster has node_groups, a plan has stages, a result has status and solver, "
        "a training file has TrainingSpec fields, a network file has links, a profile haap_profile or format, a "
        "prices file gpus (`haap-solve schema` shows each).", field="path", value=name)


def _metis_folder(p: Path) -> bool:
    """A folder holding Metis profile files (``profiles.METIS_NAME``, the name ``--profile`` reads them by)."""
    from haap_milp.estimator.profiles import METIS_NAME

    return any(METIS_NAME.match(f.name) for f in p.glob("DeviceType.*.json"))


def _result_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A ``solve --json`` document (it carries its model and cluster mappings, and names the objective
    ``iteration_time_s`` with other metrics beside it) as SolveResult fields; other results unchanged."""
    if not ("model" in data and "cluster" in data and "plan" in data):  # (their types: planfile.read_plan_file)
        return data
    fields = {k: v for k, v in data.items() if k in SolveResult.model_fields}
    if "objective_s" not in fields and "iteration_time_s" in data:
        fields["objective_s"] = data["iteration_time_s"]
    return fields


def resolve_any(text: str) -> tuple[str, Any]:
    """`show` resolution: model name, cluster name, GPU name, cluster shorthand, then a file of any kind."""
    entry = cat.model_entry(text)
    if entry is not None:
        return "model", entry.spec
    name = cat.canonical("cluster", text)
    if name is not None:
        return "cluster", preset_cluster(name)
    gpu = cat.canonical("GPU", text)
    if gpu is not None:
        return "gpu", cat.catalog().gpus[gpu].spec
    if looks_like_shorthand(text) and not path_exists(text):
        return "cluster", parse_shorthand(text)
    if looks_like_path(text):
        return load_file(text)
    keys = {k: v for kind in ("model", "cluster", "GPU") for k, v in cat.catalog().keys[kind].items()}
    close = suggest(text, keys)
    tip = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise HaapInputError(
        f"{short(text)} is not a catalog model, cluster or GPU, a cluster shorthand, or an existing file: {tip}"
        "run `haap-solve catalog` for the names it knows; a shorthand looks like 'a100-80g:64,h100-80g:32'.",
        field="name", value=text)
