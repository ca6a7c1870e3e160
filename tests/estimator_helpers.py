"""Specs built directly for the estimator tests (numbers from the vendor datasheets in gpus.yaml)."""

from __future__ import annotations

from haap_milp.specs import ClusterSpec, GPUSpec, IslandLink, ModelSpec, NodeGroup, Plan, StagePlan, TrainingSpec

A100 = GPUSpec(name="a100-80g", memory_gib=80, bf16_tflops=312, fp16_tflops=312, hbm_bandwidth_gbps=2039,
               intra_node_bandwidth_gbps=300)
H100 = GPUSpec(name="h100-80g", memory_gib=80, bf16_tflops=989.4, fp16_tflops=989.4, fp8_tflops=1978.9,
               hbm_bandwidth_gbps=3350, intra_node_bandwidth_gbps=450)
V100 = GPUSpec(name="v100-16g", memory_gib=16, fp16_tflops=125, hbm_bandwidth_gbps=900, intra_node_bandwidth_gbps=150)

LLAMA_70B = ModelSpec(name="llama3-70b", num_layers=80, hidden=8192, ffn_hidden=28672, num_heads=64, num_kv_heads=8,
                      vocab_size=128256)
LLAMA_8B = ModelSpec(name="llama3-8b", num_layers=32, hidden=4096, ffn_hidden=14336, num_heads=32, num_kv_heads=8,
                     vocab_size=128256)
GPT_18B = ModelSpec(name="gpt-18b", num_layers=40, hidden=6144, ffn_hidden=4 * 6144, num_heads=48, vocab_size=51200,
                    activation="gelu")
MOE = ModelSpec(name="moe-16x", num_layers=16, hidden=2048, ffn_hidden=8192, num_heads=16, num_kv_heads=4,
                vocab_size=32000, num_experts=16, top_k=2, moe_ffn_hidden=1408, num_shared_experts=1,
                moe_layer_pattern="first_k_dense", first_k_dense=1)


def cluster(gpu: GPUSpec = H100, nodes: int = 4, nic_gbps: float = 400.0, name: str = "c") -> ClusterSpec:
    return ClusterSpec(name=name, node_groups=(NodeGroup(gpu=gpu, num_nodes=nodes, nic_bandwidth_gbps=nic_gbps),))


def hetero_cluster(link_gbps: float = 12.5) -> ClusterSpec:
    return ClusterSpec(name="h+a", node_groups=(
        NodeGroup(gpu=H100, num_nodes=2, nic_bandwidth_gbps=400, island="east"),
        NodeGroup(gpu=A100, num_nodes=2, nic_bandwidth_gbps=200, island="west")),
        island_links=(IslandLink(a="east", b="west", bandwidth_gbps=link_gbps),))


def training(gbs: int = 64, seq: int = 4096, **kw) -> TrainingSpec:
    return TrainingSpec(global_batch_size=gbs, seq_len=seq, **kw)


def uniform_plan(model: ModelSpec, gpu: str, tp: int, pp: int, dp: int, mbs: int, gbs: int, seq: int,
                 recompute: str = "none", vpp: int = 1, island: str = "main", **kw) -> Plan:
    base, extra = divmod(model.num_layers, pp)
    stages, pos = [], 0
    for j in range(pp):
        n = base + (1 if j < extra else 0)
        stages.append(StagePlan(first_layer=pos, num_layers=n, gpu_type=gpu, island=island, tp=tp, dp=dp,
                                recompute=recompute))
        pos += n
    return Plan(model=model.name, stages=tuple(stages), micro_batch_size=mbs, num_microbatches=gbs // (mbs * dp),
                global_batch_size=gbs, seq_len=seq, schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp, **kw)
