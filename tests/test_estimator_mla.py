"""Multi-head latent attention (DeepSeek-V2/V3): spec, parameter counts, GEMMs and FLOPs, memory, time, launch
arguments. Reference numbers: DeepSeek-V3 technical report (671B total, 37B activated) and its public config.json."""

from __future__ import annotations

from dataclasses import replace

import pytest
from estimator_helpers import H100, cluster, training

from haap_milp.estimator import flops, memory
from haap_milp.estimator.cost_model import Estimator
from haap_milp.estimator.kernels import MODERN
from haap_milp.specs import ModelSpec

MLA = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
DSV3 = ModelSpec(name="deepseek-v3", num_layers=61, hidden=7168, ffn_hidden=18432, num_heads=128, vocab_size=129280,
                 num_experts=256, top_k=8, moe_ffn_hidden=2048, num_shared_experts=1,
                 moe_layer_pattern="first_k_dense", first_k_dense=3, seq_len=4096, **MLA)
SMALL = ModelSpec(name="mla-small", num_layers=4, hidden=1024, ffn_hidden=4096, num_heads=16, vocab_size=32000,
                  seq_len=2048, q_lora_rank=384, kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32,
                  v_head_dim=64)


def test_deepseek_v3_parameter_counts():
    """671B total and 37B activated (DeepSeek-V3 report, without the 14B MTP module), within 0.5 %."""
    assert DSV3.num_params_total == pytest.approx(671e9, rel=0.005)
    assert DSV3.num_params_active == pytest.approx(37.5e9, rel=0.02)
    # one layer's attention: q down 7168x1536 (+norm), q up 1536x128x192, kv down 7168x576 (+norm),
    # kv up 512x128x256, out 128x128x7168
    want = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    assert DSV3.attention_params == want


def test_mla_spec_validation():
    with pytest.raises(ValueError, match="needs qk_nope_head_dim"):
        ModelSpec(name="x", num_layers=2, hidden=1024, ffn_hidden=4096, num_heads=16, vocab_size=100, kv_lora_rank=256)
    with pytest.raises(ValueError, match="need kv_lora_rank"):
        ModelSpec(name="x", num_layers=2, hidden=1024, ffn_hidden=4096, num_heads=16, vocab_size=100, q_lora_rank=256)
    with pytest.raises(ValueError, match="one key/value head per query head"):
        ModelSpec(name="x", num_layers=2, hidden=1024, ffn_hidden=4096, num_heads=16, num_kv_heads=4, vocab_size=100,
                  **{**MLA, "q_lora_rank": None})


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_mla_gemms_use_every_weight_once_and_replicate_the_down_projections(tp):
    """Forward GEMM FLOPs per token = 2 x (weights used), the down-projections whole on every rank, the rest / tp."""
    t = 4096.0
    got = sum(g.flops for g in flops.attention_gemms(SMALL, t, tp))
    norms = SMALL.q_lora_rank + SMALL.kv_lora_rank
    rep = SMALL.mla_replicated_params - norms
    assert got == pytest.approx(2 * t * (rep + SMALL.mla_split_params / tp))
    assert memory.dense_layer_params_per_gpu(SMALL, tp) == pytest.approx(
        SMALL.mla_replicated_params + SMALL.mla_split_params / tp + SMALL.dense_mlp_params / tp + 2 * SMALL.hidden)


def test_mla_core_attention_flops_use_qk_and_v_dims():
    """QK^T over nope + rope (192) and AV over v (128): 2·t·s·heads·(192 + 128), half of it causal."""
    t = s = 4096
    assert flops.attention_core_fwd_flops(DSV3, t, s, causal=False) == 2.0 * t * s * 128 * (192 + 128)
    plain = ModelSpec(name="p", num_layers=2, hidden=4096, ffn_hidden=16384, num_heads=32, vocab_size=100)
    assert flops.attention_core_fwd_flops(plain, t, s, causal=False) == 4.0 * t * s * 32 * 128  # SC'21 eq. 1


def test_mla_up_proj_recompute_trades_memory_for_time():
    """Selective recompute of mla_up_proj drops the up-projected Q, K, V (memory) and repeats the up-projections
    (time); the latents stay."""
    est = Estimator(SMALL, cluster(H100, nodes=1), training(8, 2048))
    sel = replace(MODERN, recompute_modules=("mla_up_proj",))
    none = memory.layer_activation_bytes(SMALL, False, 1, 2048, 2, True, "selective", impl=replace(MODERN, recompute_modules=("layernorm",)))
    kept = memory.layer_activation_bytes(SMALL, False, 1, 2048, 2, True, "selective", impl=sel)
    base = memory.layer_activation_bytes(SMALL, False, 1, 2048, 2, True, "none")
    qkv = 2048 * 2 * (SMALL.q_width + SMALL.k_width + SMALL.v_width) / 2
    assert base - kept == pytest.approx(qkv)
    assert none < base  # the other module is unaffected by MLA
    t_sel = Estimator(SMALL, cluster(H100, nodes=1), training(8, 2048), impl=sel).layer_cost(
        "h100-80g", 2, 1, 1, 1, "selective", 1).compute_s
    t_none = est.layer_cost("h100-80g", 2, 1, 1, 1, "none", 1).compute_s
    assert t_sel > t_none


def test_megatron_args_and_refusals_for_mla():
    from estimator_helpers import uniform_plan

    from haap_milp.emit import megatron, torchtitan_models

    plan = uniform_plan(SMALL, "h100-80g", 2, 1, 4, 1, 8, 2048)
    args = megatron.model_args(plan, SMALL)
    assert "--multi-latent-attention" in args and "--kv-channels" not in args
    for flag, v in (("--q-lora-rank", 384), ("--kv-lora-rank", 256), ("--qk-head-dim", 64),
                    ("--qk-pos-emb-head-dim", 32), ("--v-head-dim", 64)):
        assert args[args.index(flag) + 1] == str(v)
    assert "multi-head latent attention" in torchtitan_models.architecture_refusal(SMALL)


def test_deepseek_v3_from_its_hf_config_matches_the_catalog():
    """The published config.json fields (MLA ranks and head dims, routed/shared experts, first_k_dense_replace) map
    onto the catalog entry; the MTP layer (num_nextn_predict_layers) is not part of the model."""
    from haap_milp.catalog.data import model_entry
    from haap_milp.catalog.hf_config import model_from_hf

    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "num_hidden_layers": 61,
           "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
           "first_k_dense_replace": 3, "moe_layer_freq": 1, "vocab_size": 129280, "max_position_embeddings": 163840,
           "tie_word_embeddings": False, "num_nextn_predict_layers": 1}
    hf = model_from_hf(cfg, "dsv3")
    cat = model_entry("deepseek-v3").spec
    assert hf.num_params_total == cat.num_params_total == DSV3.num_params_total
    assert (hf.kv_lora_rank, hf.q_lora_rank, hf.dim_head, hf.v_head_dim) == (512, 1536, 192, 128)
    assert hf.num_moe_layers == 58
