"""Cluster YAML/JSON data -> ClusterSpec: GPU names resolved, node defaults filled from gpus.yaml.

The file format is ClusterSpec's with three conveniences (see ``cluster_file_schema``):
``gpu`` may be a catalog name instead of a full GPUSpec mapping; ``gpus_per_node``, ``nic``
and ``nic_bandwidth_gbps`` default to the GPU's ``default_node``; ``num_gpus`` may replace
``num_nodes``. ``description`` and ``source`` are accepted and ignored.
"""

from __future__ import annotations

import copy
from typing import Any

from haap_milp.catalog.data import DefaultNode, canonical, catalog, gpu_entry
from haap_milp.catalog.files import require_mapping, short
from haap_milp.catalog.validation import validate_spec
from haap_milp.errors import HaapInputError
from haap_milp.specs import ClusterSpec
from haap_milp.specs.cluster import MAX_NODES_PER_GROUP

MAX_TOTAL_GPUS = 2**20  # ~10x the largest published training clusters; beyond is a typo
CLUSTER_META_KEYS = ("description", "source")
CLUSTER_HELP = "a cluster: name, node_groups (gpu, num_nodes, ...), island_links"


def _is_pos_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _resolve_gpu(group: dict[str, Any], where: str, context: str) -> DefaultNode | None:
    """Replace a GPU name by its GPUSpec mapping; return the GPU's default node if it is a catalog GPU."""
    gpu = group.get("gpu")
    if isinstance(gpu, str):
        try:
            entry = gpu_entry(gpu)
        except HaapInputError as exc:
            raise HaapInputError(f"{context}: field '{where}.gpu': {exc}", field=f"{where}.gpu", value=gpu) from None
        group["gpu"] = entry.spec.model_dump()
        return entry.default_node
    if isinstance(gpu, dict):
        name = canonical("GPU", gpu.get("name")) if isinstance(gpu.get("name"), str) else None
        if name:
            _same_as_catalog(gpu, name, where, context)
        return catalog().gpus[name].default_node if name else None
    if "gpu" in group:
        raise HaapInputError(f"{context}: field '{where}.gpu' = {short(gpu)}: give a catalog GPU name (e.g. "
                             "'a100-80g') or a mapping of GPUSpec fields.", field=f"{where}.gpu", value=gpu)
    return None


def _same_as_catalog(gpu: dict[str, Any], name: str, where: str, context: str) -> None:
    """A GPU mapping named like a catalog GPU must not change its specs: the cluster looks GPUs up by name,
    so a different spec under a catalog name would silently replace the catalog GPU everywhere."""
    ref = catalog().gpus[name].spec.model_dump()
    for key, value in gpu.items():
        if key in ("name", "source") or key not in ref:
            continue
        same = value == ref[key] or (isinstance(value, (int, float)) and isinstance(ref[key], (int, float))
                                     and not isinstance(value, bool) and float(value) == float(ref[key]))
        if not same:
            raise HaapInputError(
                f"{context}: field '{where}.gpu.{key}' = {short(value)} differs from catalog GPU {name!r} "
                f"({short(ref[key])}); a GPU with its own specs needs its own name (e.g. '{name}-custom'), or "
                f"write gpu: {name} to use the catalog one.", field=f"{where}.gpu.{key}", value=value)


def _num_gpus_to_nodes(group: dict[str, Any], where: str, context: str) -> None:
    if "num_gpus" not in group:
        return
    count, per = group.pop("num_gpus"), group.get("gpus_per_node", 8)
    if "num_nodes" in group:
        raise HaapInputError(f"{context}: '{where}' gives both num_gpus and num_nodes; give one.",
                             field=f"{where}.num_gpus", value=count)
    if not _is_pos_int(count) or not _is_pos_int(per) or count % per:
        raise HaapInputError(f"{context}: field '{where}.num_gpus' = {short(count)}: must be a positive multiple of "
                             f"gpus_per_node ({short(per)}).", field=f"{where}.num_gpus", value=count)
    if count // per > MAX_NODES_PER_GROUP:  # (said in the user's terms, not as the num_nodes it becomes)
        raise HaapInputError(f"{context}: field '{where}.num_gpus' = {short(count)}: at most "
                             f"{MAX_NODES_PER_GROUP * per:,} GPUs ({MAX_NODES_PER_GROUP:,} nodes of {short(per)}) a "
                             "group.", field=f"{where}.num_gpus", value=count)
    group["num_nodes"] = count // per


def _fill_group(raw: Any, i: int, context: str) -> Any:
    """One node group with the GPU resolved and defaults filled; non-mappings pass to pydantic."""
    if not isinstance(raw, dict):
        return raw
    where = f"node_groups.{i}"
    group = dict(raw)
    node = _resolve_gpu(group, where, context)
    if node is not None:
        group.setdefault("gpus_per_node", node.gpus_per_node)
    _num_gpus_to_nodes(group, where, context)
    if node is not None:
        group.setdefault("nic", node.nic)
        if "nic_bandwidth_gbps" not in group and _is_pos_int(group.get("gpus_per_node")):
            group["nic_bandwidth_gbps"] = node.nic_bandwidth_for(group["gpus_per_node"])
    return group


def cluster_from_data(data: Any, name: str, context: str) -> ClusterSpec:
    """Validate parsed cluster data (a preset, a user file, a shorthand) into a ClusterSpec."""
    data = require_mapping(data, context, CLUSTER_HELP, context=True)
    fields = {k: v for k, v in data.items() if k not in CLUSTER_META_KEYS}
    fields.setdefault("name", name)
    groups = fields.get("node_groups")
    if isinstance(groups, list):
        fields["node_groups"] = [_fill_group(g, i, context) for i, g in enumerate(groups)]
    spec = validate_spec(ClusterSpec, fields, context)
    if spec.total_gpus > MAX_TOTAL_GPUS:
        raise HaapInputError(f"{context}: {spec.total_gpus} GPUs in total is beyond the {MAX_TOTAL_GPUS} this planner "
                             "accepts; check num_nodes and gpus_per_node.", field="node_groups", value=spec.total_gpus)
    return spec


def preset_cluster(name: str) -> ClusterSpec:
    """A built-in preset by canonical name."""
    return cluster_from_data(copy.deepcopy(catalog().clusters[name]), name, f"built-in cluster {name!r}")


def cluster_file_schema() -> dict[str, Any]:
    """JSON Schema of the cluster *file* format: ClusterSpec's, with the conveniences above."""
    schema = ClusterSpec.model_json_schema()
    schema["title"] = "ClusterFile"
    schema["description"] = (__doc__ or "").strip()
    schema["required"] = ["node_groups"]
    props = schema["properties"]
    for key in ("total_gpus", "gpus_per_type", "gpus_per_island"):  # computed on output, ignored on input
        props.pop(key, None)
    props["description"] = {"type": "string", "description": "Free text, ignored."}
    props["source"] = {"type": "string", "description": "Where the cluster description comes from, ignored."}
    node = schema["$defs"]["NodeGroup"]
    node["properties"]["gpu"] = {
        "anyOf": [{"type": "string", "description": "Catalog GPU name (`haap-solve catalog gpus`)."},
                  {"$ref": "#/$defs/GPUSpec"}],
        "description": "GPU type: a catalog name or a full GPUSpec mapping."}
    node["properties"]["num_gpus"] = {"type": "integer", "minimum": 1,
                                      "description": "Alternative to num_nodes: GPUs in the group."}
    node["required"] = ["gpu"]
    return schema
