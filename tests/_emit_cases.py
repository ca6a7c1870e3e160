"""Hand-made specs and plans for the emitter tests (built from specs directly, independent of the catalog)."""

from __future__ import annotations

from haap_milp.specs import ClusterSpec, GPUSpec, IslandLink, ModelSpec, NodeGroup, Plan, StagePlan

H100 = GPUSpec(name="h100-80g", memory_gib=80, bf16_tflops=989, fp16_tflops=989, hbm_bandwidth_gbps=3350,
               intra_node_bandwidth_gbps=450)
A100 = GPUSpec(name="a100-80g", memory_gib=80, bf16_tflops=312, fp16_tflops=312, hbm_bandwidth_gbps=2039,
               intra_node_bandwidth_gbps=300)
V100 = GPUSpec(name="v100-32g", memory_gib=32, fp16_tflops=125, hbm_bandwidth_gbps=900,
               intra_node_bandwidth_gbps=150)

DENSE = ModelSpec(name="tiny-gqa", num_layers=8, hidden=1024, ffn_hidden=4096, num_heads=16, num_kv_heads=4,
                  vocab_size=32000, seq_len=2048)
TIED = ModelSpec(name="tiny-tied", num_layers=12, hidden=1024, ffn_hidden=2816, num_heads=16, num_kv_heads=8,
                 vocab_size=32000, tied_embeddings=True)
MOE = ModelSpec(name="tiny-moe", num_layers=8, hidden=1024, ffn_hidden=4096, num_heads=16, vocab_size=32000,
                num_experts=8, top_k=2, moe_ffn_hidden=1024, moe_layer_pattern="every_k", moe_layer_freq=2)

# torchtitan runs only its registry models: the shapes of its llama3 8B flavor (torchtitan 0.3.0
# torchtitan/models/llama3/__init__.py:236-274), written out here, independent of the emitter's table.
LLAMA8B = ModelSpec(name="llama3-8b", num_layers=32, hidden=4096, ffn_hidden=14336, num_heads=32, num_kv_heads=8,
                    vocab_size=128256, seq_len=8192, activation="swiglu", normalization="rmsnorm",
                    position_embedding="rope", rope_base=500000)

A100_16 = ClusterSpec(name="a100-16", node_groups=(NodeGroup(gpu=A100, num_nodes=2, nic_bandwidth_gbps=200),))
H100_A100 = ClusterSpec(name="h100-a100", node_groups=(NodeGroup(gpu=H100, num_nodes=1, nic_bandwidth_gbps=400),
                                                        NodeGroup(gpu=A100, num_nodes=1, nic_bandwidth_gbps=200)))
ISLANDS = ClusterSpec(
    name="h100-ib-v100-roce",
    node_groups=(NodeGroup(gpu=H100, num_nodes=1, nic_bandwidth_gbps=400, island="ib-h100"),
                 NodeGroup(gpu=V100, num_nodes=2, nic="roce", nic_bandwidth_gbps=12.5, island="roce-v100"),
                 NodeGroup(gpu=V100, num_nodes=1, nic="ethernet", nic_bandwidth_gbps=3, island="eth-v100")),
    island_links=(IslandLink(a="ib-h100", b="roce-v100", bandwidth_gbps=3.125),
                  IslandLink(a="ib-h100", b="eth-v100", bandwidth_gbps=3.125),
                  IslandLink(a="roce-v100", b="eth-v100", bandwidth_gbps=3.125)),
)


def _stages(specs) -> tuple[StagePlan, ...]:
    out, first = [], 0
    for n, gpu, island, tp, dp, rc in specs:
        out.append(StagePlan(first_layer=first, num_layers=n, gpu_type=gpu, island=island, tp=tp, dp=dp,
                             recompute=rc))
        first += n
    return tuple(out)


def uniform_plan() -> Plan:
    """Homogeneous: 2 stages x (tp 2, dp 4) on A100s, even split, selective recompute."""
    st = _stages([(4, "a100-80g", "main", 2, 4, "selective"), (4, "a100-80g", "main", 2, 4, "selective")])
    return Plan(model=DENSE.name, cluster=A100_16.name, stages=st, micro_batch_size=1, num_microbatches=16,
                global_batch_size=64, seq_len=2048)


def hetero_uniform_plan() -> Plan:
    """Two GPU types, uniform tp/dp, non-uniform layers: what Megatron and torchtitan can run."""
    st = _stages([(5, "h100-80g", "main", 2, 4, "none"), (3, "a100-80g", "main", 2, 4, "none")])
    return Plan(model=DENSE.name, cluster=H100_A100.name, stages=st, micro_batch_size=2, num_microbatches=8,
                global_batch_size=64, seq_len=2048)


def interleaved_plan() -> Plan:
    """pp 4 x vpp 2 on two GPU types with an uneven split (Megatron layout with 8 virtual stages)."""
    st = _stages([(3, "h100-80g", "main", 1, 2, "full"), (3, "h100-80g", "main", 1, 2, "full"),
                  (1, "a100-80g", "main", 1, 2, "full"), (1, "a100-80g", "main", 1, 2, "full")])
    return Plan(model=DENSE.name, cluster=H100_A100.name, stages=st, micro_batch_size=1, num_microbatches=8,
                global_batch_size=16, seq_len=2048, schedule="interleaved", vpp=2)


def hetero_plan() -> Plan:
    """FlagScale-only: per-stage tp/dp and recompute across three islands and NICs, tied embeddings."""
    st = _stages([(6, "h100-80g", "ib-h100", 2, 4, "none"), (2, "v100-32g", "roce-v100", 4, 2, "full"),
                  (2, "v100-32g", "roce-v100", 4, 2, "full"), (2, "v100-32g", "eth-v100", 2, 4, "none")])
    return Plan(model=TIED.name, cluster=ISLANDS.name, stages=st, micro_batch_size=1, num_microbatches=16,
                global_batch_size=64, seq_len=2048, precision="fp16")


def llama_hetero_plan() -> Plan:
    """llama3-8b on two GPU types, uniform tp/dp, 20 | 12 layers: all three engines run it."""
    st = _stages([(20, "h100-80g", "main", 2, 4, "selective"), (12, "a100-80g", "main", 2, 4, "selective")])
    return Plan(model=LLAMA8B.name, cluster=H100_A100.name, stages=st, micro_batch_size=1, num_microbatches=16,
                global_batch_size=64, seq_len=4096)


def moe_plan() -> Plan:
    st = tuple(StagePlan(first_layer=4 * j, num_layers=4, gpu_type="a100-80g", tp=2, dp=4, ep=4, etp=1)
               for j in range(2))
    return Plan(model=MOE.name, cluster=A100_16.name, stages=st, micro_batch_size=1, num_microbatches=8,
                global_batch_size=32, seq_len=2048)


CASES = {  # name -> (plan factory, model, cluster, targets that accept it)
    "uniform": (uniform_plan, DENSE, A100_16, ("megatron", "flagscale", "torchtitan")),
    "hetero_uniform": (hetero_uniform_plan, DENSE, H100_A100, ("megatron", "flagscale", "torchtitan")),
    "llama_hetero": (llama_hetero_plan, LLAMA8B, H100_A100, ("megatron", "flagscale", "torchtitan")),
    "interleaved": (interleaved_plan, DENSE, H100_A100, ("megatron",)),
    "hetero": (hetero_plan, TIED, ISLANDS, ("flagscale",)),
    "moe": (moe_plan, MOE, A100_16, ("megatron", "flagscale")),
}
