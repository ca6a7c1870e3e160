"""Megatron-LM emitter: layout grammar, argument-validation rules (one bad case each), rank order."""

from __future__ import annotations

import json
import re

import pytest
from _emit_cases import A100_16, DENSE, H100_A100, MOE, hetero_uniform_plan, interleaved_plan, uniform_plan

from haap_milp.emit import EmitError, emit
from haap_milp.emit.megatron import build_args, layout_string, plan_violations
from haap_milp.emit.megatron_rules import layout_violations, parse_layout, validate_megatron_args
from haap_milp.specs import StagePlan


def grammar_parse(layout: str) -> list[list[str]]:
    """An independent reading of the documented grammar (Megatron's parse_str_to_list docstring):
    ``stage ('|' stage)*``; a stage is a sequence of items; an item is a layer char E|L|t|m,
    optionally ``*n``, or ``'(' body ')' '*' n`` where body may itself contain ``|``; commas are
    cosmetic. Written as a recursive-descent parser over an unrolled token stream."""
    text = layout.replace(",", "")
    pos = 0

    def number() -> int:
        nonlocal pos
        m = re.match(r"\d+", text[pos:])
        assert m, f"expected a number at {pos} in {layout!r}"
        pos += len(m.group())
        return int(m.group())

    def sequence(stop: str | None) -> str:
        nonlocal pos
        out = []
        while pos < len(text) and text[pos] != stop:
            c = text[pos]
            if c == "(":
                pos += 1
                body = sequence(")")
                assert text[pos:pos + 2] == ")*", f"group without repeat in {layout!r}"
                pos += 2
                out.append(body * number())
            elif c in "ELtm|":
                pos += 1
                if text[pos:pos + 1] == "*":
                    pos += 1
                    out.append(c * number())
                else:
                    out.append(c)
            else:
                raise AssertionError(f"unexpected {c!r} in {layout!r}")
        return "".join(out)

    flat = sequence(None)
    return [list(stage) for stage in flat.split("|")]


@pytest.mark.parametrize("layout,expected", [
    ("Ettt|(tt|)*3,m|L", [list("Ettt")] + [list("tt")] * 3 + [["m"], ["L"]]),
    ("E,t*3|t*4|t*5,L", [list("Ettt"), list("tttt"), list("tttttL")]),
    ("E|(t|)*2,tL", [["E"], ["t"], ["t"], ["t", "L"]]),
])
def test_parse_layout_matches_documented_examples(layout, expected):
    assert parse_layout(layout) == expected
    assert grammar_parse(layout) == expected


@pytest.mark.parametrize("factory", [hetero_uniform_plan, interleaved_plan])
def test_layout_of_a_real_plan_parses_and_matches_the_split(factory):
    plan = factory()
    layout = layout_string(plan)
    assert layout is not None
    stages = grammar_parse(layout)
    assert stages == parse_layout(layout)
    assert layout_violations(layout, plan.pp, DENSE.num_layers) == []
    assert len(stages) == plan.pp * plan.vpp
    per_stage = [0] * plan.pp
    for k, st in enumerate(stages):  # virtual stage k sits on pipeline rank k % pp
        per_stage[k % plan.pp] += st.count("t")
    assert per_stage == [s.num_layers for s in plan.stages]
    assert stages[0][0] == "E" and stages[-1][-1] == "L"


def test_even_split_needs_no_layout():
    assert layout_string(uniform_plan()) is None
    assert "--pipeline-model-parallel-layout" not in build_args(uniform_plan(), DENSE)


def _argv(**over) -> list[str]:
    base = {"num-layers": "8", "num-attention-heads": "16", "tensor-model-parallel-size": "2",
            "pipeline-model-parallel-size": "2", "micro-batch-size": "1", "global-batch-size": "64",
            "seq-length": "2048"}
    base.update({k.replace("_", "-"): v for k, v in over.items()})
    out = []
    for k, v in base.items():
        if v is None:
            continue
        out += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return out


def rules(argv, world=16) -> set[str]:
    return {v.rule for v in validate_megatron_args(argv, world)}


def test_valid_arguments_pass():
    assert rules(_argv()) == set()


@pytest.mark.parametrize("over,world,rule", [
    ({}, 10, "megatron.world_size"),
    ({"global_batch_size": "62"}, 16, "megatron.global_batch"),
    ({"num_attention_heads": "15"}, 16, "megatron.heads_tp"),
    ({"group_query_attention": True, "num_query_groups": "3"}, 16, "megatron.query_groups_tp"),
    ({"num_layers": "7"}, 16, "megatron.layers_pp"),
    ({"pipeline_model_parallel_layout": "E,t*3|t*4"}, 16, "megatron.layout_loss"),
    ({"pipeline_model_parallel_layout": "t*4|t*4,L"}, 16, "megatron.layout_embedding"),
    ({"pipeline_model_parallel_layout": "E,t*3|t*4,L"}, 16, "megatron.layout_layers"),
    ({"pipeline_model_parallel_layout": "E,t*3|t*3|t*2,L"}, 16, "megatron.layout_pp"),
    ({"pipeline_model_parallel_layout": "E,t*3|t*x,L"}, 16, "megatron.layout_grammar"),
    ({"pipeline_model_parallel_layout": "E,t*2|t*2|t*2|t*2,L", "num_virtual_stages_per_pipeline_rank": "2"}, 16,
     "megatron.vpp_flags"),
    ({"pipeline_model_parallel_layout": "E,t*2|t*2|t*2|t*2,L"}, 16, "megatron.vpp_pp"),
    ({"pipeline_model_parallel_size": "4", "pipeline_model_parallel_layout": "E|t|t|t|t|t|t|t|t|L|||",
      "global_batch_size": "12"}, 16, "megatron.vpp_microbatches"),
    ({"num_virtual_stages_per_pipeline_rank": "3"}, 16, "megatron.layers_vpp"),
    ({"context_parallel_size": "2", "seq_length": "2050"}, 16, "megatron.seq_cp"),
    ({"expert_model_parallel_size": "2"}, 16, "megatron.ep_dense"),
    ({"num_experts": "6", "expert_model_parallel_size": "4", "sequence_parallel": True}, 16, "megatron.experts_ep"),
    ({"num_experts": "8", "expert_model_parallel_size": "2"}, 16, "megatron.ep_tp_sp"),
    ({"num_experts": "16", "expert_model_parallel_size": "16", "expert_tensor_parallel_size": "1",
      "sequence_parallel": True}, 16, "megatron.expert_groups"),
    ({"recompute_granularity": "selective", "recompute_method": "uniform"}, 16, "megatron.recompute_method"),
])
def test_each_rule_rejects_its_bad_case(over, world, rule):
    assert rule in rules(_argv(**over), world)


def test_emitted_arguments_pass_validation():
    for plan, model in ((uniform_plan(), DENSE), (hetero_uniform_plan(), DENSE), (interleaved_plan(), DENSE)):
        assert plan_violations(plan, model) == []


def test_non_uniform_plan_is_refused_naming_the_feature():
    plan = hetero_uniform_plan()
    bad = plan.model_copy(update={"stages": (plan.stages[0], plan.stages[1].model_copy(update={"tp": 4, "dp": 2}))})
    with pytest.raises(EmitError, match=r"per-stage tensor-parallel size.*--target flagscale"):
        emit(bad, "megatron", H100_A100, DENSE)


def test_moe_flags():
    from _emit_cases import moe_plan

    a = build_args(moe_plan(), MOE)
    joined = " ".join(a)
    assert "--num-experts 8" in joined and "--moe-router-topk 2" in joined
    assert "--expert-model-parallel-size 4" in joined and "--expert-tensor-parallel-size 1" in joined
    assert "--moe-layer-freq [0,1,0,1,0,1,0,1]" in joined  # every_k=2 -> layers 1,3,5,7
    assert validate_megatron_args(a, 16) == []


def test_rank_order_puts_each_stage_on_its_gpu_type():
    plan = hetero_uniform_plan()
    files = emit(plan, "megatron", H100_A100, DENSE)
    rank_map = json.loads(files["rank_map.json"])
    node_type = {n["name"]: n["gpu_type"] for n in rank_map["nodes"]}
    hostfile = [ln.split()[0] for ln in files["hostfile"].splitlines() if not ln.startswith("#")]
    assert hostfile == [n["name"] for n in rank_map["nodes"]]
    rank_to_node = {}
    for n in rank_map["nodes"]:
        for k in range(n["nproc_per_node"]):
            rank_to_node[n["first_rank"] + k] = n["name"]
    for st in rank_map["stages"]:
        for r in range(st["first_rank"], st["first_rank"] + st["num_ranks"]):
            assert node_type[rank_to_node[r]] == plan.stages[st["stage"]].gpu_type


def test_stage_on_missing_gpu_type_is_refused():
    plan = hetero_uniform_plan()
    bad = plan.model_copy(update={"stages": (plan.stages[0], StagePlan(first_layer=5, num_layers=3,
                                                                         gpu_type="v100-32g", tp=2, dp=4))})
    with pytest.raises(EmitError, match="v100-32g"):
        emit(bad, "megatron", H100_A100, DENSE)


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "flagscale"])
@pytest.mark.parametrize("island", ["a) touch /tmp/pwned ;; x", "rack 1", "$(id)"])
def test_island_with_shell_syntax_cannot_name_a_host(target, island):
    """Node names '<island>-<gpu>-g<group>-n<k>' are case patterns in launch.sh and words of the hostfile: an
    island 'a) touch /tmp/pwned ;; x' ran 'touch' on the node launched as HAAP_NODE=a. Refused, naming it."""
    plan = uniform_plan()
    groups = tuple(g.model_copy(update={"island": island}) for g in A100_16.node_groups)
    cluster = A100_16.model_copy(update={"node_groups": groups})
    bad = plan.model_copy(update={"stages": tuple(s.model_copy(update={"island": island}) for s in plan.stages)})
    with pytest.raises(EmitError, match=r"island .* cannot be part of a node name.*use letters, digits"):
        emit(bad, target, cluster, DENSE)
    ok = "ib-rack_1.east+2"
    fine = A100_16.model_copy(update={"node_groups": tuple(g.model_copy(update={"island": ok}) for g in groups)})
    good = plan.model_copy(update={"stages": tuple(s.model_copy(update={"island": ok}) for s in plan.stages)})
    assert f"{ok}-a100-80g-g0-n0" in emit(good, "megatron", fine, DENSE)["hostfile"]
