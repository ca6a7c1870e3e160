"""Plain-dict summaries of a model, cluster or GPU (what `haap-solve show` prints)."""

from __future__ import annotations

from typing import Any

from haap_milp.catalog import data as cat
from haap_milp.specs import GIB, ClusterSpec, GPUSpec, ModelSpec

BF16_BYTES = 2
# bf16 params + fp32 grads + Adam (fp32 master, m, v) = 2 + 4 + 12 bytes per parameter, no sharding
# (Megatron-LM docs/user-guide/features/dist_optimizer.md, "bf16 params / fp32 grads: 18").
TRAINING_STATE_BYTES_PER_PARAM = 18


def model_summary(spec: ModelSpec) -> dict[str, Any]:
    """Parameter counts, shapes, MoE layout and weight memory of a model."""
    entry = cat.model_entry(spec.name)
    builtin = entry is not None and entry.spec == spec
    moe = None
    if spec.is_moe:
        moe = {"num_experts": spec.num_experts, "top_k": spec.top_k, "expert_ffn_hidden": spec.expert_ffn,
               "num_shared_experts": spec.num_shared_experts, "shared_expert_ffn_hidden": spec.shared_ffn,
               "num_moe_layers": spec.num_moe_layers, "moe_layer_pattern": spec.moe_layer_pattern,
               "capacity_factor": spec.capacity_factor}
    return {
        "kind": "model",
        "name": spec.name,
        "builtin": builtin,
        "source": entry.source if builtin else "",
        "notes": entry.notes if builtin else "",
        "num_params_total": spec.num_params_total,
        "num_params_active": spec.num_params_active,
        "weight_memory_bf16_gib": spec.num_params_total * BF16_BYTES / GIB,
        "training_state_memory_gib": spec.num_params_total * TRAINING_STATE_BYTES_PER_PARAM / GIB,
        "shapes": {"num_layers": spec.num_layers, "hidden": spec.hidden, "ffn_hidden": spec.ffn_hidden,
                   "num_heads": spec.num_heads, "num_kv_heads": spec.kv_heads, "head_dim": spec.dim_head,
                   "vocab_size": spec.vocab_size, "seq_len": spec.seq_len, "activation": spec.activation,
                   "tied_embeddings": spec.tied_embeddings, "qkv_bias": spec.qkv_bias},
        "moe": moe,
        "params_breakdown": {"embedding": spec.embedding_params, "attention_per_layer": spec.attention_params,
                             "dense_mlp_per_layer": spec.dense_mlp_params if spec.num_moe_layers < spec.num_layers
                             else 0, "expert": spec.expert_params if spec.is_moe else 0,
                             "router_per_layer": spec.router_params if spec.is_moe else 0,
                             "final_norm_and_head": spec.head_params},
        "spec": spec.model_dump(mode="json"),
    }


def _peak(gpu: GPUSpec, n: int) -> float | None:
    return None if gpu.bf16_tflops is None else gpu.bf16_tflops * n / 1000


def cluster_summary(spec: ClusterSpec) -> dict[str, Any]:
    """Per-type and per-island GPU totals, node groups and links of a cluster."""
    preset = cat.catalog().clusters.get(spec.name)
    types = [{"gpu": name, "num_gpus": n, "memory_gib": spec.gpu(name).memory_gib,
              "bf16_tflops": spec.gpu(name).bf16_tflops, "total_memory_gib": spec.gpu(name).memory_gib * n,
              "peak_bf16_pflops": _peak(spec.gpu(name), n)} for name, n in spec.gpus_per_type.items()]
    islands = []
    for island, n in spec.gpus_per_island.items():
        groups = [g for g in spec.node_groups if g.island == island]
        per_type: dict[str, int] = {}
        for g in groups:
            per_type[g.gpu.name] = per_type.get(g.gpu.name, 0) + g.num_gpus
        islands.append({"island": island, "num_gpus": n, "gpus_per_type": per_type,
                        "nics": sorted({g.nic for g in groups})})
    no_bf16 = [t["gpu"] for t in types if t["bf16_tflops"] is None]
    return {
        "kind": "cluster",
        "name": spec.name,
        "description": " ".join(str(preset.get("description", "")).split()) if preset else "",
        "total_gpus": spec.total_gpus,
        "gpus_per_type": spec.gpus_per_type,
        "gpus_per_island": spec.gpus_per_island,
        "total_memory_gib": sum(t["total_memory_gib"] for t in types),
        "peak_bf16_pflops": sum(t["peak_bf16_pflops"] or 0.0 for t in types),
        "gpu_types_without_bf16": no_bf16,
        "types": types,
        "islands": islands,
        "node_groups": [{"gpu": g.gpu.name, "num_nodes": g.num_nodes, "gpus_per_node": g.gpus_per_node,
                         "num_gpus": g.num_gpus, "nic": g.nic, "nic_bandwidth_gbps": g.nic_bandwidth_gbps,
                         "island": g.island} for g in spec.node_groups],
        "island_links": [link.model_dump(mode="json") for link in spec.island_links],
        "spec": spec.model_dump(mode="json"),
    }


def gpu_summary(spec: GPUSpec) -> dict[str, Any]:
    """A catalog GPU with its default node (what the shorthand assumes)."""
    entry = cat.catalog().gpus.get(spec.name)
    extra: dict[str, Any] = {}
    if entry is not None and entry.spec == spec:
        node = entry.default_node
        extra = {"aliases": list(entry.aliases), "datasheet_name": entry.datasheet_name,
                 "form_factor": entry.form_factor, "confidence": entry.confidence, "notes": entry.notes,
                 "default_node": {"gpus_per_node": node.gpus_per_node, "nic": node.nic,
                                  "nic_bandwidth_gbps": node.nic_bandwidth_gbps, "rationale": node.rationale}}
    return {"kind": "gpu", "name": spec.name, **extra, "spec": spec.model_dump(mode="json")}
