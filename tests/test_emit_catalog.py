"""Every distinct catalog architecture x engine: the emitted model definition, or a refusal with the reason.

Expected values are written out from the published model configs (the same sources the catalog cites:
HF config.json of each model, GPT-3 / OPT papers), independently of the emitter; golden files keep the
whole model-definition file per (model, engine) small and reviewable
(regenerate: HAAP_UPDATE_GOLDEN=1 pytest tests/test_emit_catalog.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from _emit_cases import A100_16

from haap_milp.catalog.data import model_entry
from haap_milp.emit import EmitError, emit
from haap_milp.emit.megatron_rules import parse_argv
from haap_milp.specs import Plan, StagePlan

GOLDEN = Path(__file__).parent / "golden" / "catalog"
ENGINES = ("megatron", "flagscale", "torchtitan")

def arch(**fields) -> dict:
    return fields


# One model per distinct architecture of the catalog, with what its published config says.
# norm/eps/positions/base/bias/qkv-bias/qk-norm/untied/query groups/MoE (experts, top-k, aux-loss coefficient)
EXPECTED = {
    "gpt3-1.3b": arch(norm="LayerNorm", eps=1e-5, pos="learned_absolute", base=None, swiglu=False, bias=True,
                      qkv_bias=True, qk_norm=False, untied=False, groups=None, moe=None),
    "llama2-7b": arch(norm="RMSNorm", eps=1e-5, pos="rope", base=10000, swiglu=True, bias=False, qkv_bias=False,
                      qk_norm=False, untied=True, groups=None, moe=None),
    "llama3-8b": arch(norm="RMSNorm", eps=1e-5, pos="rope", base=500000, swiglu=True, bias=False, qkv_bias=False,
                      qk_norm=False, untied=True, groups=8, moe=None),
    "qwen2.5-7b": arch(norm="RMSNorm", eps=1e-6, pos="rope", base=1000000, swiglu=True, bias=False, qkv_bias=True,
                       qk_norm=False, untied=True, groups=4, moe=None),
    "mixtral-8x7b": arch(norm="RMSNorm", eps=1e-5, pos="rope", base=1000000, swiglu=True, bias=False, qkv_bias=False,
                         qk_norm=False, untied=True, groups=8, moe=(8, 2, 0.02)),
    "qwen3-235b-a22b": arch(norm="RMSNorm", eps=1e-6, pos="rope", base=1000000, swiglu=True, bias=False,
                            qkv_bias=False, qk_norm=True, untied=True, groups=4, moe=(128, 8, 0.001)),
    "opt-350m": None,  # ReLU MLP: no Megatron-LM argument builds it
    "gpt-neo-2.7b": arch(norm="LayerNorm", eps=1e-5, pos="learned_absolute", base=None, swiglu=False, bias=True,
                         qkv_bias=False, qk_norm=False, untied=False, groups=None, moe=None),
}
# torchtitan 0.3.0: llama3-8b is its registry flavor 8B; llama2-7b and qwen3-235b-a22b (rope theta 1e6, not the
# registry's 5e6) are built with its llama3 / qwen3 layer builders; the others lack a torchtitan architecture
TORCHTITAN_RUNS = {"llama3-8b": "model_registry('8B')", "llama2-7b": "_build_llama3_layers(",
                   "qwen3-235b-a22b": "_build_qwen3_moe_layers("}
TORCHTITAN_REFUSED = {"gpt3-1.3b": "activation gelu", "gpt-neo-2.7b": "activation gelu", "opt-350m": "activation relu",
                      "qwen2.5-7b": "linear biases", "mixtral-8x7b": "MoE without q/k-norm"}


def plan_for(name: str) -> Plan:
    """Two even stages of tp 2 x dp 4 on 16 A100s (ep 4 for MoE), 8 micro-batches of 1."""
    m = model_entry(name).spec
    half = m.num_layers // 2
    ep = 4 if m.is_moe else 1
    st = (StagePlan(first_layer=0, num_layers=half, gpu_type="a100-80g", tp=2, dp=4, ep=ep),
          StagePlan(first_layer=half, num_layers=m.num_layers - half, gpu_type="a100-80g", tp=2, dp=4, ep=ep))
    return Plan(model=name, cluster=A100_16.name, stages=st, micro_batch_size=1, num_microbatches=8,
                global_batch_size=32, seq_len=2048)


def _emit(name: str, target: str):
    return emit(plan_for(name), target, A100_16, model_entry(name).spec)


def _megatron_view(files: dict) -> dict:
    text = files["megatron_args.sh"]
    body = text[text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=("):text.rindex(")")]
    argv = [tok.strip("'") for tok in body.split()]
    return parse_argv(argv)


def _flagscale_view(files: dict) -> dict:
    return {k: (True if v is True else str(v)) for k, v in yaml.safe_load(files["flagscale_train.yaml"])["model"].items()}


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("target", ["megatron", "flagscale"])
def test_megatron_family_model_definition(name, target):
    exp = EXPECTED[name]
    if exp is None:
        with pytest.raises(EmitError, match="ReLU"):
            _emit(name, target)
        return
    files = _emit(name, target)
    a = _megatron_view(files) if target == "megatron" else _flagscale_view(files)
    m = model_entry(name).spec
    assert a["normalization"] == exp["norm"] and float(a["norm_epsilon"]) == exp["eps"]
    assert a["position_embedding_type"] == exp["pos"]
    assert (float(a["rotary_base"]) if "rotary_base" in a else None) == exp["base"]
    assert ("swiglu" in a) == exp["swiglu"]
    assert ("disable_bias_linear" not in a) == exp["bias"]
    assert (("add_qkv_bias" in a) or exp["bias"]) == (exp["qkv_bias"] or exp["bias"])
    assert ("qk_layernorm" in a) == exp["qk_norm"]
    assert ("untie_embeddings_and_output_weights" in a) == exp["untied"]
    assert (int(a["num_query_groups"]) if "group_query_attention" in a else None) == exp["groups"]
    assert int(a["kv_channels"]) == m.dim_head and int(a["num_layers"]) == m.num_layers
    if exp["moe"] is None:
        assert "num_experts" not in a
    else:
        experts, topk, aux = exp["moe"]
        assert int(a["num_experts"]) == experts and int(a["moe_router_topk"]) == topk
        assert a["moe_router_load_balancing_type"] == "aux_loss" and float(a["moe_aux_loss_coeff"]) == aux
        assert a["moe_token_dispatcher_type"] == "alltoall"  # FlagScale's default would be allgather


@pytest.mark.parametrize("name", list(EXPECTED))
def test_torchtitan_builds_or_refuses_with_the_reason(name):
    if name in TORCHTITAN_RUNS:
        files = _emit(name, "torchtitan")
        assert TORCHTITAN_RUNS[name] in files["haap_torchtitan.py"]
    else:
        with pytest.raises(EmitError, match=TORCHTITAN_REFUSED[name]) as err:
            _emit(name, "torchtitan")
        assert "--target megatron" in str(err.value)


def test_torchtitan_toml_form_names_registry_flavors_only():
    """--engine-version 0.1 (TOML) cannot carry a built model: refused, pointing at the default version."""
    assert 'flavor = "8B"' in emit(plan_for("llama3-8b"), "torchtitan", A100_16, model_entry("llama3-8b").spec,
                                   engine_version="0.1")["torchtitan.toml"]
    with pytest.raises(EmitError, match="registry flavors only"):
        emit(plan_for("llama2-7b"), "torchtitan", A100_16, model_entry("llama2-7b").spec, engine_version="0.1")


def _key_file(name: str, target: str) -> str:
    try:
        files = _emit(name, target)
    except EmitError as exc:
        return f"refused: {exc}\n"
    return files[{"megatron": "megatron_args.sh", "flagscale": "flagscale_train.yaml",
                  "torchtitan": "haap_torchtitan.py"}[target]]


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("target", ENGINES)
def test_catalog_golden(name, target):
    path = GOLDEN / f"{name}.{target}.txt"
    text = _key_file(name, target)
    if os.environ.get("HAAP_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (HAAP_UPDATE_GOLDEN=1 to accept)"
