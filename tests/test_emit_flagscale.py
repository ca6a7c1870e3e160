"""FlagScale emitter: a heterogeneous config satisfies every listed rule; each rule rejects a bad config."""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from _emit_cases import (
    A100,
    A100_16,
    CASES,
    DENSE,
    H100,
    ISLANDS,
    MOE,
    TIED,
    hetero_plan,
    interleaved_plan,
    moe_plan,
    uniform_plan,
)

from haap_milp.emit import EmitError, emit
from haap_milp.emit.flagscale import build_config, meshes, plan_violations, validate_flagscale_config
from haap_milp.specs import ClusterSpec, NodeGroup, Plan, StagePlan


def _config(plan=None, model=TIED):
    files = emit(plan or hetero_plan(), "flagscale", ISLANDS, model)
    text = files["flagscale_train.yaml"]
    return yaml.safe_load(text), files


def test_heterogeneous_config_satisfies_every_listed_rule():
    plan = hetero_plan()
    cfg, files = _config(plan)
    h, sysc, mdl = cfg["system"]["hetero"], cfg["system"], cfg["model"]
    flat = h["hetero_process_meshes"]
    ms = [flat[i:i + 5] for i in range(0, len(flat), 5)]
    tps, cps, _eps, dps, pps = zip(*ms)
    # meshes: tp, cp, ep, dp, pp; pp sums to the pipeline; split per stage sums to the layers
    assert sum(pps) == sysc["pipeline_model_parallel_size"] == plan.pp
    assert h["hetero_pipeline_layer_split"] == [s.num_layers for s in plan.stages]
    assert sum(h["hetero_pipeline_layer_split"]) == TIED.num_layers
    assert len(h["hetero_device_types"]) == len(ms)
    # each mesh's micro-batch rescaled so every stage sees the same samples: dp_0*mbs % dp_i == 0
    assert all((dps[0] * mdl["micro_batch_size"]) % d == 0 for d in dps)
    per_mesh_mbs = [dps[0] * mdl["micro_batch_size"] // d for d in dps]
    assert {m * d for m, d in zip(per_mesh_mbs, dps)} == {plan.samples_per_microbatch}
    # equal cp, no vpp, tied embeddings -> first and last mesh the same tp
    assert len(set(cps)) == 1
    assert "num_layers_per_virtual_pipeline_stage" not in sysc
    assert TIED.tied_embeddings and tps[0] == tps[-1]
    # per-stage recompute: full on the two RoCE V100 stages only
    assert sysc["recompute_granularity"] == "full"
    assert sysc["recompute_granularity_per_stage_micro_batch"] == ["1, 16, 0", "1, 16, 1", "1, 16, 1", "1, 16, 0"]
    # the GPUs: every mesh's world matches the stages it holds, device types follow the hostfile order
    types = [ln.split("type=")[1] for ln in files["hostfile"].splitlines() if "type=" in ln]
    assert types == ["h100-80g", "v100-32g", "v100-32g", "v100-32g"]
    assert validate_flagscale_config(cfg, TIED.num_layers, TIED.num_heads, TIED.kv_heads, True) == []


def test_consecutive_identical_stages_form_one_mesh():
    ms = meshes(hetero_plan())
    assert [(m["gpu_type"], m["tp"], m["dp"], m["pp"]) for m in ms] == [
        ("h100-80g", 2, 4, 1), ("v100-32g", 4, 2, 2), ("v100-32g", 2, 4, 1)]
    assert [m["stages"] for m in ms] == [[0], [1, 2], [3]]


def _valid():
    return build_config(hetero_plan(), TIED)


def _check(cfg):
    return {v.rule for v in validate_flagscale_config(cfg, TIED.num_layers, TIED.num_heads, TIED.kv_heads, True)}


def _mut(path_value):
    cfg = copy.deepcopy(_valid())
    for path, value in path_value:
        node = cfg
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return cfg


H = ("system", "hetero")


@pytest.mark.parametrize("changes,rule", [
    ([(H + ("hetero_process_meshes",), [2, 1, 1, 4, 1, 4, 1, 1, 2])], "flagscale.mesh_format"),
    ([(("system", "pipeline_model_parallel_size"), 5)], "flagscale.pp_sum"),
    ([(H + ("hetero_pipeline_layer_split",), [6, 2, 2, 3])], "flagscale.layer_split"),
    ([(H + ("hetero_device_types",), ["h100-80g", "v100-32g"])], "flagscale.device_types"),
    ([(H + ("hetero_process_meshes",), [2, 1, 1, 4, 1, 4, 1, 1, 3, 2, 2, 1, 1, 4, 1])], "flagscale.microbatch_rescale"),
    ([(H + ("hetero_process_meshes",), [2, 1, 1, 4, 1, 4, 2, 1, 2, 2, 2, 1, 1, 4, 1])], "flagscale.equal_cp"),
    ([(("model", "global_batch_size"), 66)], "flagscale.global_batch"),
    ([(H + ("hetero_process_meshes",), [2, 1, 1, 4, 1, 4, 1, 1, 2, 2, 4, 1, 1, 2, 1])], "flagscale.tied_tp"),
    ([(H + ("hetero_process_meshes",), [2, 1, 1, 4, 1, 4, 1, 1, 2, 2, 2, 1, 1, 3, 1])], "flagscale.tied_dp"),
    ([(("system", "num_layers_per_virtual_pipeline_stage"), 1)], "flagscale.no_vpp"),
    ([(H + ("hetero_process_meshes",), [2, 1, 1, 4, 1, 3, 1, 1, 2, 2, 2, 1, 1, 4, 1])], "flagscale.heads_tp"),
    ([(H + ("hetero_process_meshes",), [2, 1, 2, 4, 1, 4, 1, 1, 2, 2, 2, 1, 1, 4, 1])], "flagscale.experts_ep"),
    ([(("system", "recompute_granularity"), "selective")], "flagscale.recompute"),
    ([(("system", "recompute_granularity_per_stage_micro_batch"), ["1, 16, 0", "1, 15, 1", "2, 16, 1"])],
     "flagscale.recompute"),
    ([(("system", "recompute_granularity_per_stage_micro_batch"), ["1, 16, 0", "1, 16, 1"])], "flagscale.recompute"),
])
def test_each_rule_rejects_its_bad_config(changes, rule):
    assert _check(_valid()) == set()
    assert rule in _check(_mut(changes))


def test_ep_with_tp_needs_sequence_parallel():
    cfg = build_config(moe_plan(), MOE)
    cfg["system"]["sequence_parallel"] = False
    rules = {v.rule for v in validate_flagscale_config(cfg, MOE.num_layers, MOE.num_heads, MOE.kv_heads, False, 8)}
    assert "flagscale.ep_tp_sp" in rules


def test_refusals_name_the_feature():
    with pytest.raises(EmitError, match=r"virtual pipeline.*--target megatron"):
        emit(interleaved_plan(), "flagscale", ISLANDS, DENSE)
    plan = hetero_plan()
    mixed = plan.model_copy(update={"stages": (plan.stages[0].model_copy(update={"recompute": "selective"}),
                                               *plan.stages[1:])})
    assert any(v.rule == "flagscale.recompute" for v in plan_violations(mixed, TIED))
    untied_tp = plan.model_copy(update={"stages": (*plan.stages[:3], plan.stages[3].model_copy(update={"tp": 4,
                                                                                                      "dp": 2}))})
    with pytest.raises(EmitError, match="same tp"):
        emit(untied_tp, "flagscale", ISLANDS, TIED)


def test_uniform_plan_is_one_mesh():
    cfg = build_config(uniform_plan(), DENSE)
    assert cfg["system"]["hetero"]["hetero_process_meshes"] == [2, 1, 1, 4, 2]
    assert cfg["system"]["recompute_granularity"] == "selective"
    assert "recompute_granularity_per_stage_micro_batch" not in cfg["system"]


# ---- GPU types that recur in non-adjacent meshes (a100 | h100 | a100)

A100_H100_A100 = ClusterSpec(name="a-h-a", node_groups=(NodeGroup(gpu=A100, num_nodes=2, nic_bandwidth_gbps=200),
                                                         NodeGroup(gpu=H100, num_nodes=1, nic_bandwidth_gbps=400)))


def _recurring_plan() -> Plan:
    st = (StagePlan(first_layer=0, num_layers=3, gpu_type="a100-80g", tp=2, dp=4),
          StagePlan(first_layer=3, num_layers=3, gpu_type="h100-80g", tp=2, dp=4),
          StagePlan(first_layer=6, num_layers=2, gpu_type="a100-80g", tp=2, dp=4))
    return Plan(model=DENSE.name, cluster=A100_H100_A100.name, stages=st, micro_batch_size=1, num_microbatches=8,
                global_batch_size=32, seq_len=2048)


# FlagScale's runner reads the hostfile with this pattern, skipping lines that start with '#' and refusing a
# host listed twice (flagscale/runner/runner_utils.py parse_hostfile, :34); node_rank = line order.
FLAGSCALE_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)(?:\s+type=(\S+))?")


def flagscale_hostfile(hostfile: str) -> list[tuple[str, int, str | None]]:
    """(host, slots, type) per node, as FlagScale's parse_hostfile reads it."""
    out = []
    for line in hostfile.splitlines():
        line = line.strip()
        if line.startswith("#") or not line:
            continue
        m = FLAGSCALE_HOSTFILE_LINE.search(line)
        assert m, f"FlagScale refuses hostfile line {line!r}"
        assert m.group(1) not in [h for h, _, _ in out], f"host {m.group(1)} listed twice"
        out.append((m.group(1), int(m.group(2)), m.group(3)))
    return out


def flagscale_physical_order(hostfile: str, device_types: list[str]) -> list[tuple[str, str]]:
    """The logical rank order of FlagScale's RankMapper: physical ranks (node_rank = hostfile order, each
    node's slots in order) sorted by the first index of their device type in ``hetero_device_types``, then
    by physical rank (flagscale/train/hetero/parallel_context.py @34bd35b :75-88, ``_compare``).
    Returns (node, type) per logical rank."""
    physical = [(name, typ) for name, slots, typ in flagscale_hostfile(hostfile) for _ in range(slots)]
    order = sorted(range(len(physical)), key=lambda r: (device_types.index(physical[r][1]), r))
    return [physical[r] for r in order]


@pytest.mark.parametrize("case", ["hetero", "hetero_uniform", "llama_hetero", "moe", "uniform"])
def test_hostfile_parses_as_flagscale_reads_it(case):
    factory, model, cluster, _ = CASES[case]
    files = emit(factory(), "flagscale", cluster, model)
    h = yaml.safe_load(files["flagscale_train.yaml"])["system"]["hetero"]
    nodes = flagscale_hostfile(files["hostfile"])
    assert {t for _, _, t in nodes} == set(h["hetero_device_types"])  # every node typed, every label used
    assert h["hetero_current_device_type"] in h["hetero_device_types"]  # arguments.py :225-227
    flat = h["hetero_process_meshes"]  # tp, cp, ep, dp, pp per mesh; world tp*cp*dp*pp each (arguments.py :233-234)
    world = sum(tp * cp * dp * pp for tp, cp, _, dp, pp in (flat[i:i + 5] for i in range(0, len(flat), 5)))
    assert sum(slots for _, slots, _ in nodes) == world


def test_recurring_gpu_types_get_distinct_labels_and_land_on_their_gpus():
    plan = _recurring_plan()
    files = emit(plan, "flagscale", A100_H100_A100, DENSE)
    h = yaml.safe_load(files["flagscale_train.yaml"])["system"]["hetero"]
    assert h["hetero_device_types"] == ["a100-80g", "h100-80g", "a100-80g#2"]
    order = flagscale_physical_order(files["hostfile"], h["hetero_device_types"])
    rank = 0
    for j, s in enumerate(plan.stages):
        for r in range(rank, rank + s.tp * s.dp):
            node, label = order[r]
            assert label.split("#")[0] == s.gpu_type, f"stage {j} rank {r} on {node} ({label})"
            assert s.gpu_type in node
        rank += s.tp * s.dp


def test_plain_type_labels_would_misplace_the_recurring_mesh():
    """Why the labels are needed: with type= the GPU name for every node, the mapper puts both a100 nodes
    first, so the h100 mesh runs on the second a100 node."""
    plan = _recurring_plan()
    files = emit(plan, "flagscale", A100_H100_A100, DENSE)
    plain = "\n".join(line.split("#")[0] if "type=" in line else line for line in files["hostfile"].splitlines())
    order = flagscale_physical_order(plain, ["a100-80g", "h100-80g", "a100-80g"])
    assert order[8][1] == "a100-80g"  # first rank of the h100 stage lands on an a100


def test_flagscale_refuses_context_parallelism():
    plan = uniform_plan().model_copy(update={"cp": 2, "global_batch_size": 64})
    with pytest.raises(EmitError, match="Context parallelism is not supported"):
        emit(plan, "flagscale", A100_16, DENSE)


def test_flagscale_sets_the_dispatcher_and_launch_notes():
    files = emit(moe_plan(), "flagscale", A100_16, MOE)
    assert yaml.safe_load(files["flagscale_train.yaml"])["model"]["moe_token_dispatcher_type"] == "alltoall"
    assert "CUDA_DEVICE_MAX_CONNECTIONS: 1" in files["LAUNCH.txt"]
