"""torchtitan config module and TOML, NCCL per-node environment, and the rank placement shared by all emitters."""

from __future__ import annotations

import ast
import json
import tomllib

import pytest
from _emit_cases import (
    A100,
    A100_16,
    DENSE,
    H100_A100,
    ISLANDS,
    LLAMA8B,
    MOE,
    TIED,
    hetero_plan,
    hetero_uniform_plan,
    interleaved_plan,
    llama_hetero_plan,
    moe_plan,
    uniform_plan,
)

from haap_milp.emit import EmitError, emit
from haap_milp.emit.nccl import emit_nccl_env
from haap_milp.emit.placement import place
from haap_milp.emit.torchtitan import build_python, build_toml, module_fqns, plan_violations, validate
from haap_milp.specs import ClusterSpec, NodeGroup, Plan, StagePlan


def test_torchtitan_toml_parses_and_covers_every_layer_once_in_order():
    plan = llama_hetero_plan()
    doc = tomllib.loads(build_toml(plan, LLAMA8B))
    assert doc["model"] == {"name": "llama3", "flavor": "8B"}
    par = doc["parallelism"]
    parts = par["module_fqns_per_model_part"]
    layers = [n for part in parts for n in part if n.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(LLAMA8B.num_layers)]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert [sum(n.startswith("layers.") for n in p) for p in parts] == [20, 12]
    s = plan.stages[0]
    assert par["tensor_parallel_degree"] * par["data_parallel_shard_degree"] * par["pipeline_parallel_degree"] \
        * par["data_parallel_replicate_degree"] == plan.num_gpus
    assert doc["training"]["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == plan.num_microbatches
    assert doc["training"]["local_batch_size"] * s.dp == plan.global_batch_size


def test_torchtitan_python_config_is_valid_python_with_the_plan():
    plan = llama_hetero_plan()
    text = build_python(plan, LLAMA8B)
    tree = ast.parse(text)
    assert "def haap_plan" in text and "model_registry('8B')" in text and "llama3_8b()" in text
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
                "ParallelismConfig")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    parts = kw["module_fqns_per_model_part"]
    assert parts[-1][-2:] == ["norm", "lm_head"]  # 0.3.0 names the output projection lm_head
    assert kw["tensor_parallel_degree"] * kw["data_parallel_shard_degree"] * kw["pipeline_parallel_degree"] \
        * kw["data_parallel_replicate_degree"] == plan.num_gpus
    assert "SelectiveAC.Config()" in text


def test_torchtitan_interleaved_parts_follow_virtual_stage_order():
    plan = hetero_uniform_plan()
    parts = module_fqns(plan.model_copy(update={"vpp": 2, "schedule": "interleaved"}))
    assert len(parts) == 4
    assert [sum(n.startswith("layers.") for n in p) for p in parts] == [3, 2, 2, 1]  # (stage0 c0, s1 c0, s0 c1, s1 c1)


def test_torchtitan_refusals():
    assert any(v.rule == "torchtitan.uniform" for v in plan_violations(hetero_plan(), TIED))
    assert any(v.rule == "torchtitan.tied" for v in plan_violations(hetero_plan(), TIED))
    assert any(v.rule == "torchtitan.empty_part" for v in plan_violations(interleaved_plan(), DENSE))
    assert plan_violations(uniform_plan(), DENSE) == []  # built with torchtitan's llama3 layer builders
    qkv_bias = DENSE.model_copy(update={"qkv_bias": True})
    assert {v.rule for v in plan_violations(uniform_plan(), qkv_bias)} == {"torchtitan.model"}
    with pytest.raises(EmitError, match="--target flagscale"):
        emit(hetero_plan(), "torchtitan", ISLANDS, TIED)
    # ep must divide dp_shard*cp*tp (torchtitan 0.3.0 config/configs.py:279-287): 2 here without FSDP
    bad_ep = moe_plan().model_copy(update={"distributed_optimizer": False})
    assert {v.rule for v in validate(bad_ep, MOE)} == {"torchtitan.ep"}
    assert validate(moe_plan(), MOE) == []
    bad_batch = uniform_plan().model_copy(update={"global_batch_size": 66})
    assert {v.rule for v in validate(bad_batch, DENSE)} == {"torchtitan.batch"}


@pytest.mark.parametrize("precision", ["fp16", "fp8"])
def test_torchtitan_refuses_precisions_it_cannot_set(precision):
    plan = llama_hetero_plan().model_copy(update={"precision": precision})
    with pytest.raises(EmitError, match="mixed_precision_param is bfloat16 or float32"):
        emit(plan, "torchtitan", H100_A100, LLAMA8B)


def test_torchtitan_versions_and_files():
    files = emit(llama_hetero_plan(), "torchtitan", H100_A100, LLAMA8B)
    assert {"haap_torchtitan.py", "launch.sh", "LAUNCH.txt"} <= set(files)
    assert "--module haap_torchtitan --config haap_plan" in files["launch.sh"]
    assert "torchtitan 0.3.0" in files["LAUNCH.txt"]
    old = emit(llama_hetero_plan(), "torchtitan", H100_A100, LLAMA8B, engine_version="0.1")
    assert "torchtitan.toml" in old and "--job.config_file" in old["launch.sh"]
    with pytest.raises(EmitError, match="not emitted"):
        emit(llama_hetero_plan(), "torchtitan", H100_A100, LLAMA8B, engine_version="0.2")
    with pytest.raises(EmitError, match="one version only"):
        emit(llama_hetero_plan(), "megatron", H100_A100, LLAMA8B, engine_version="0.1")


def test_nccl_env_only_for_mixed_nics_and_per_node_transports():
    assert emit_nccl_env(uniform_plan(), A100_16) == {}
    text = emit_nccl_env(hetero_plan(), ISLANDS)["nccl_env.sh"]
    lines = {ln.split(")")[0].strip(): ln for ln in text.splitlines() if ") export" in ln}
    assert set(lines) == {"ib-h100-h100-80g-g0-n0", "roce-v100-v100-32g-g1-n0", "roce-v100-v100-32g-g1-n1",
                          "eth-v100-v100-32g-g2-n0"}
    assert "NCCL_NET=Socket" in lines["eth-v100-v100-32g-g2-n0"] and "NCCL_IB_DISABLE=1" in lines[
        "eth-v100-v100-32g-g2-n0"]
    # the RoCE stages sit between the IB island and the Ethernet node: no IB verbs path to either
    assert "NCCL_NET=Socket" in lines["roce-v100-v100-32g-g1-n0"]
    assert "NCCL_NET=Socket" in lines["ib-h100-h100-80g-g0-n0"]


def test_nccl_roce_island_keeps_ib_verbs_when_neighbours_allow():
    cluster = ClusterSpec(name="roce2", node_groups=(
        NodeGroup(gpu=A100, num_nodes=2, nic="roce", nic_bandwidth_gbps=25, island="roce-a"),
        NodeGroup(gpu=A100, num_nodes=2, nic="ethernet", nic_bandwidth_gbps=3, island="eth")),
        island_links=({"a": "roce-a", "b": "eth", "bandwidth_gbps": 3},))
    st = tuple(StagePlan(first_layer=2 * j, num_layers=2, gpu_type="a100-80g", island=isl, tp=2, dp=4)
               for j, isl in enumerate(["roce-a", "roce-a", "eth", "eth"]))
    plan = Plan(model="tiny-gqa", stages=st, micro_batch_size=1, num_microbatches=8, global_batch_size=32,
                seq_len=2048)
    text = emit_nccl_env(plan, cluster)["nccl_env.sh"]
    first = next(ln for ln in text.splitlines() if ln.strip().startswith("roce-a-a100-80g-g0-n0)"))
    assert "NCCL_NET=IB" in first and "NCCL_IB_GID_INDEX=3" in first


def test_placement_packs_small_stages_and_keeps_tp_groups_inside_a_node():
    cluster = ClusterSpec(name="c", node_groups=(NodeGroup(gpu=A100, num_nodes=3, nic_bandwidth_gbps=25),))
    st = (StagePlan(first_layer=0, num_layers=2, gpu_type="a100-80g", tp=2, dp=3),   # 6 GPUs
          StagePlan(first_layer=2, num_layers=2, gpu_type="a100-80g", tp=4, dp=1),   # 4: does not fit the 2 left
          StagePlan(first_layer=4, num_layers=4, gpu_type="a100-80g", tp=1, dp=6))   # 6
    plan = Plan(model="m", stages=st, micro_batch_size=2, num_microbatches=4, global_batch_size=48, seq_len=128)
    p = place(plan, cluster)
    assert [n.devices for n in p.nodes] == [(0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5, 6, 7), (0, 1)]
    for j, s in enumerate(st):
        lo = p.stage_first_rank[j]
        for g in range(lo, lo + s.tp * s.dp, s.tp):
            assert len({p.rank_location(r)[0] for r in range(g, g + s.tp)}) == 1
    doc = json.loads(p.rank_map_json())
    assert doc["world_size"] == 16 and [n["first_rank"] for n in doc["nodes"]] == [0, 6, 14]


def test_placement_runs_out_of_nodes_with_numbers():
    st = tuple(StagePlan(first_layer=j, num_layers=1, gpu_type="h100-80g", tp=4, dp=2) for j in range(2))
    plan = Plan(model="m", stages=st, micro_batch_size=1, num_microbatches=2, global_batch_size=4, seq_len=128)
    with pytest.raises(EmitError, match=r"stage 1 needs 8 h100-80g"):
        place(plan, H100_A100)
