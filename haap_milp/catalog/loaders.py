"""Public loaders: a model, cluster or GPU from a catalog name, a file, or the cluster shorthand.

Resolution order (documented in ``load_model``/``load_cluster``): catalog names first (so a
file that happens to be called ``llama3-8b`` needs ``./llama3-8b``), then files, then shorthand.
Every user mistake raises ``HaapInputError`` (one paragraph naming field and value).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from haap_milp.catalog import data as cat
from haap_milp.catalog.cluster_file import cluster_from_data, preset_cluster
from haap_milp.catalog.files import is_dir, is_file, load_data, looks_like_path, path_exists, require_mapping, short
from haap_milp.catalog.hf_config import is_hf_config, model_from_hf
from haap_milp.catalog.shorthand import looks_like_shorthand, parse_shorthand
from haap_milp.catalog.validation import unknown_name_error, validate_spec
from haap_milp.errors import HaapInputError
from haap_milp.specs import ClusterSpec, GPUSpec, ModelSpec, TrainingSpec

MAX_MODEL_PARAMS = 10**14  # 100x the largest catalog model (megatron-1t); beyond is a typo, not a model
MODEL_META_KEYS = ("source", "notes", "description", "base")
MODEL_KEYS = {"num_layers", "hidden", "base", "num_heads", "ffn_hidden"}
MODEL_HELP = "a model: num_layers, hidden, ffn_hidden, num_heads, vocab_size, ... (see `haap-solve schema model`)"


def detect_kind(data: Any) -> str | None:
    """model | cluster | plan | result | training | network | profile | prices from a parsed mapping's keys, or None
    when nothing fits (network: ``haap-solve network import``'s file; profile: either native form; prices:
    ``--prices``)."""
    if not isinstance(data, dict):
        return None
    keys = set(data)
    if is_hf_config(data) or keys & MODEL_KEYS:
        return "model"
    if "node_groups" in keys:
        return "cluster"
    if "stages" in keys:
        return "plan"
    if {"status", "solver"} <= keys:
        return "result"
    if data.get("kind") == "network" or "links" in keys:
        return "network"
    if "haap_profile" in keys or data.get("format") == "haap-profile":
        return "profile"
    if isinstance(data.get("gpus"), dict):  # (its other keys are checked by the prices loader, which names a bad one)
        return "prices"
    if keys and keys <= set(TrainingSpec.model_fields):
        return "training"
    return None


def _expect_kind(data: Any, expected: str, name: str) -> None:
    kind = detect_kind(data)
    if kind is not None and kind != expected:
        raise HaapInputError(f"{name!r} describes a {kind}, not a {expected}; give a {expected} file here "
                             f"(`haap-solve validate {short(name)}` says what a file is).", field="path", value=name)


def load_gpu(name: str) -> GPUSpec:
    """Catalog GPU by case-insensitive name or alias ('A100-80G', 'a100-sxm4-80gb')."""
    return cat.gpu_entry(name).spec


def display_name(path: Path) -> str:
    """'…/Meta-Llama-3-8B/config.json' -> 'Meta-Llama-3-8B'; 'x/my-model.yaml' -> 'my-model'."""
    stem = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return (stem or path.name or "model")[:200]


def model_from_data(data: Any, name: str, context: str, where: str = "") -> ModelSpec:
    """A model mapping (YAML/JSON): ModelSpec fields, optionally over a catalog ``base`` model; or a HF config."""
    if is_hf_config(data):
        return check_model_size(model_from_hf(data, name, where), context)
    data = require_mapping(data, context, MODEL_HELP, context=True)
    fields = {k: v for k, v in data.items() if k not in MODEL_META_KEYS}
    base = data.get("base")
    if base is not None:
        entry = cat.model_entry(base) if isinstance(base, str) else None
        if entry is None:
            raise HaapInputError(f"{context}: field 'base' = {short(base)} is not a catalog model; "
                                 f"{unknown_name_error('model', str(base), cat.catalog().keys['model'], 'models')}",
                                 field="base", value=base)
        fields = {**entry.spec.model_dump(exclude={*ModelSpec.model_computed_fields, "name"}), **fields}
    fields.setdefault("name", name)
    spec = validate_spec(ModelSpec, fields, context)
    return check_model_size(spec, context)


def check_model_size(spec: ModelSpec, context: str) -> ModelSpec:
    if spec.num_params_total > MAX_MODEL_PARAMS:
        raise HaapInputError(f"{context}: {spec.num_params_total:.3g} parameters is beyond the {MAX_MODEL_PARAMS:.0e} "
                             "this planner accepts; check num_layers, hidden, ffn_hidden and num_experts.",
                             field="num_params_total", value=spec.num_params_total)
    return spec


def _model_file(text: str) -> ModelSpec:
    path = Path(text)
    if is_dir(path) and is_file(path / "config.json"):  # a HF checkpoint directory
        path = path / "config.json"
    data = load_data(path, "model file")
    _expect_kind(data, "model", str(path))
    return model_from_data(data, display_name(path), f"model file {str(path)!r}", str(path))


def load_model(text: str) -> ModelSpec:
    """A model from a catalog name/alias, a HF ``config.json`` (or its directory), or a YAML/JSON model file."""
    if not isinstance(text, str):
        raise HaapInputError(f"model should be a name or a path, not {short(text)}.", field="model", value=text)
    entry = cat.model_entry(text)
    if entry is not None:
        return entry.spec
    if looks_like_path(text):
        return _model_file(text)
    raise unknown_name_error("model", text, cat.catalog().keys["model"], "models",
                             "; or give a model YAML file or a Hugging Face config.json path")


def load_cluster(text: str) -> ClusterSpec:
    """A cluster from a catalog name, a YAML/JSON file, or the shorthand 'a100-80g:64,v100-32g:32/8@roce'."""
    if not isinstance(text, str):
        raise HaapInputError(f"cluster should be a name, path or shorthand, not {short(text)}.", field="cluster",
                             value=text)
    name = cat.canonical("cluster", text)
    if name is not None:
        return preset_cluster(name)
    if looks_like_shorthand(text) and not path_exists(text):
        return parse_shorthand(text)
    if looks_like_path(text):
        path = Path(text)
        data = load_data(path, "cluster file")
        _expect_kind(data, "cluster", text)
        return cluster_from_data(data, path.stem[:200] or "cluster", f"cluster file {text!r}")
    gpu = cat.canonical("GPU", text)
    hint = f"; '{gpu}' is a GPU: write e.g. '{gpu}:8' for one node" if gpu else \
        "; or give a cluster YAML file or a shorthand such as 'a100-80g:64,h100-80g:32'"
    raise unknown_name_error("cluster", text, cat.catalog().keys["cluster"], "clusters", hint)


def cluster_from_file_data(data: Any, name: str) -> ClusterSpec:
    """For callers that already parsed a file (validate)."""
    return cluster_from_data(data, Path(name).stem[:200] or "cluster", f"cluster file {name!r}")


def spec_from_data(cls: type, data: Any, context: str) -> Any:
    """Validate already-parsed data into any spec class (TrainingSpec, Plan, SolveResult)."""
    return validate_spec(cls, require_mapping(data, context, cls.__name__, context=True), context)
