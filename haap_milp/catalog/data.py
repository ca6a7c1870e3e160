"""The built-in catalogs: gpus.yaml, models.yaml, clusters.yaml (package data), read once.

Lookups are case-, dash- and underscore-insensitive and accept each entry's aliases.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from haap_milp.catalog.validation import normalize, unknown_name_error, validate_spec
from haap_milp.specs import GPUSpec, ModelSpec

GPU_META_KEYS = ("datasheet_name", "aliases", "form_factor", "confidence", "notes", "default_node")
MODEL_META_KEYS = ("family", "aliases", "source", "notes")


@dataclass(frozen=True)
class DefaultNode:
    """What a node of one GPU type looks like when the user says nothing (cluster shorthand)."""

    gpus_per_node: int
    nic: str
    nic_bandwidth_gbps: float
    rationale: str

    def nic_bandwidth_for(self, gpus_per_node: int) -> float:
        """NIC GB/s of a node with ``gpus_per_node`` GPUs: one rail per GPU (rail-optimised nodes,
        e.g. DGX A100/H100: one NIC per GPU), so bandwidth scales with GPUs per node."""
        return self.nic_bandwidth_gbps * gpus_per_node / self.gpus_per_node


@dataclass(frozen=True)
class GPUEntry:
    spec: GPUSpec
    default_node: DefaultNode
    aliases: tuple[str, ...] = ()
    datasheet_name: str = ""
    form_factor: str = ""
    confidence: str = ""
    notes: str = ""


@dataclass(frozen=True)
class ModelEntry:
    spec: ModelSpec
    source: str
    family: str = ""
    aliases: tuple[str, ...] = ()
    notes: str = ""


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, GPUEntry]
    models: dict[str, ModelEntry]
    clusters: dict[str, dict[str, Any]]  # raw preset data, built by loaders.cluster_from_data
    shorthand: dict[str, Any]
    keys: dict[str, dict[str, str]] = field(default_factory=dict)  # kind -> normalised name -> canonical


# The built-in catalog files (this package's own, trusted) are parsed by libyaml when PyYAML has it: the same
# documents (checked equal, tests/test_overhead.py) in 0.02 s instead of 0.2 s of every command's start-up.
# Users' files go through catalog/files.py's bounded loader.
_BUILTIN_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def builtin_yaml(name: str, loader=_BUILTIN_LOADER) -> Any:
    """A built-in catalog file (``haap_milp/catalog/<name>``) as Python data (YAML safe subset)."""
    text = resources.files("haap_milp.catalog").joinpath(name).read_text(encoding="utf-8")
    return yaml.load(text, Loader=loader)  # a safe loader: CSafeLoader or SafeLoader


def _read(name: str) -> dict[str, Any]:
    return builtin_yaml(name)


def _index(entries: dict[str, Any], kind: str) -> dict[str, str]:
    """normalised name/alias -> canonical name; a clash is a catalog bug."""
    keys: dict[str, str] = {}
    for canonical, entry in entries.items():
        for name in (canonical, *getattr(entry, "aliases", ())):
            key = normalize(name)
            assert keys.get(key, canonical) == canonical, f"{kind} name clash: {name!r} vs {keys[key]!r}"
            keys[key] = canonical
    return keys


def _gpu_entry(name: str, row: dict[str, Any]) -> GPUEntry:
    spec_fields = {k: v for k, v in row.items() if k not in GPU_META_KEYS}
    spec = validate_spec(GPUSpec, {"name": name, **spec_fields}, f"built-in GPU {name!r}")
    return GPUEntry(spec=spec, default_node=DefaultNode(**row["default_node"]), aliases=tuple(row.get("aliases", ())),
                    datasheet_name=row.get("datasheet_name", ""), form_factor=row.get("form_factor", ""),
                    confidence=row.get("confidence", ""), notes=row.get("notes", ""))


def _model_entry(name: str, row: dict[str, Any], families: dict[str, Any]) -> ModelEntry:
    family = families.get(row.get("family", ""), {})
    fields = {**family.get("defaults", {}), **{k: v for k, v in row.items() if k not in MODEL_META_KEYS}}
    spec = validate_spec(ModelSpec, {"name": name, **fields}, f"built-in model {name!r}")
    source = " ".join(str(row.get("source") or family.get("source", "")).split())
    return ModelEntry(spec=spec, source=source, family=row.get("family", ""), aliases=tuple(row.get("aliases", ())),
                      notes=" ".join(str(row.get("notes", "")).split()))


@functools.cache
def catalog() -> Catalog:
    """All three catalogs, parsed and validated once per process."""
    gpus_raw, models_raw, clusters_raw = _read("gpus.yaml"), _read("models.yaml"), _read("clusters.yaml")
    gpus = {n: _gpu_entry(n, row) for n, row in gpus_raw["gpus"].items()}
    models = {n: _model_entry(n, row, models_raw.get("families", {})) for n, row in models_raw["models"].items()}
    clusters = dict(clusters_raw["clusters"])
    keys = {"GPU": _index(gpus, "GPU"), "model": _index(models, "model"), "cluster": _index(clusters, "cluster")}
    return Catalog(gpus=gpus, models=models, clusters=clusters, shorthand=clusters_raw["shorthand"], keys=keys)


def canonical(kind: str, name: str) -> str | None:
    """The canonical catalog name of ``name`` (kind: 'GPU', 'model', 'cluster'), or None."""
    if not isinstance(name, str):
        return None
    return catalog().keys[kind].get(normalize(name))


def gpu_entry(name: str) -> GPUEntry:
    """Catalog GPU by (case-insensitive) name or alias; unknown names -> HaapInputError with suggestions."""
    found = canonical("GPU", name)
    if found is None:
        raise unknown_name_error("GPU", name, catalog().keys["GPU"], "gpus")
    return catalog().gpus[found]


def model_entry(name: str) -> ModelEntry | None:
    found = canonical("model", name)
    return catalog().models[found] if found else None


def gpu_names() -> list[str]:
    return list(catalog().gpus)


def model_names() -> list[str]:
    return list(catalog().models)


def cluster_names() -> list[str]:
    return list(catalog().clusters)
