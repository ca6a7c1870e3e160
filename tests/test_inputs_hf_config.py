"""Hugging Face config.json import: published configs give the published parameter counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from haap_milp.catalog import load_model
from haap_milp.errors import HaapInputError

# Published config.json contents (keys we read plus some we ignore), from the Hugging Face hub.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000}
MISTRAL_7B = {**LLAMA3_8B, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32000,
              "max_position_embeddings": 32768, "sliding_window": 4096, "head_dim": None}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 152064}
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"], "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "model_type": "qwen2_moe",
    "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "shared_expert_intermediate_size": 5632, "tie_word_embeddings": False, "vocab_size": 151936}
QWEN3_235B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 1536, "norm_topk_prob": True,
    "num_attention_heads": 64, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "vocab_size": 151936}
GPT2 = {"architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new", "model_type": "gpt2", "n_ctx": 1024,
        "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257}
PYTHIA_160M = {"architectures": ["GPTNeoXForCausalLM"], "hidden_act": "gelu", "hidden_size": 768,
               "intermediate_size": 3072, "max_position_embeddings": 2048, "model_type": "gpt_neox",
               "num_attention_heads": 12, "num_hidden_layers": 12, "tie_word_embeddings": False, "vocab_size": 50304}
OPT_350M = {"architectures": ["OPTForCausalLM"], "activation_function": "relu", "ffn_dim": 4096, "hidden_size": 1024,
            "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 16, "num_hidden_layers": 24,
            "vocab_size": 50272, "word_embed_proj_dim": 512, "do_layer_norm_before": False}
GPT_NEO_27B = {"architectures": ["GPTNeoForCausalLM"], "activation_function": "gelu_new", "hidden_size": 2560,
               "intermediate_size": None, "max_position_embeddings": 2048, "model_type": "gpt_neo", "num_heads": 20,
               "num_layers": 32, "vocab_size": 50257, "attention_types": [[["global", "local"], 16]]}


def write(tmp_path: Path, cfg: dict[str, Any], folder: str = "model") -> str:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("cfg,catalog_name", [(LLAMA3_8B, "llama3-8b"), (MIXTRAL_8X7B, "mixtral-8x7b"),
                                              (QWEN25_7B, "qwen2.5-7b"), (OPT_350M, "opt-350m"),
                                              (GPT_NEO_27B, "gpt-neo-2.7b"), (QWEN3_235B, "qwen3-235b-a22b")])
def test_config_matches_catalog_model(tmp_path: Path, cfg: dict[str, Any], catalog_name: str) -> None:
    spec, ref = load_model(write(tmp_path, cfg)), load_model(catalog_name)
    assert spec.name == "model"  # the checkpoint folder names the model
    assert (spec.num_params_total, spec.num_params_active) == (ref.num_params_total, ref.num_params_active)
    keys = ("num_layers", "hidden", "num_heads", "kv_heads", "dim_head", "vocab_size", "activation", "qkv_bias",
            "tied_embeddings", "num_experts", "top_k", "expert_ffn", "norm_epsilon", "rope_base",
            "qk_norm")  # (eps, RoPE base and q/k norm: what emit writes)
    assert {k: getattr(spec, k) for k in keys} == {k: getattr(ref, k) for k in keys}


@pytest.mark.parametrize("cfg,total,active,source", [
    (MISTRAL_7B, 7.24e9, None, "HF mistralai/Mistral-7B-v0.1 model page: 7.24B params"),
    (QWEN15_MOE_A27B, 14.3e9, 2.7e9, "Qwen/Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated"),
    (GPT2, 124_439_808, None, "HF openai-community/gpt2 safetensors: 124,439,808 params"),
    (PYTHIA_160M, 162_322_944, None, "HF EleutherAI/pythia-160m safetensors: 162,322,944 params"),
])
def test_config_parameter_counts_match_published(tmp_path: Path, cfg: dict[str, Any], total: float,
                                                 active: float | None, source: str) -> None:
    spec = load_model(write(tmp_path, cfg))
    assert spec.num_params_total == pytest.approx(total, rel=0.01), source
    assert spec.num_params_active == pytest.approx(active or total, rel=0.01), source


def test_checkpoint_directory_and_long_context_seq_len(tmp_path: Path) -> None:
    path = write(tmp_path, QWEN25_7B, "Qwen2.5-7B")
    spec = load_model(str(Path(path).parent))  # the directory holding config.json
    assert spec.name == "Qwen2.5-7B" and spec.qkv_bias  # Qwen2 always has Q/K/V bias
    assert spec.seq_len == 8192  # 131072-token context is not a pre-training length


def test_qwen_moe_layer_layouts(tmp_path: Path) -> None:
    every2 = load_model(write(tmp_path, {**QWEN15_MOE_A27B, "decoder_sparse_step": 2}, "a"))
    assert every2.num_moe_layers == 12 and every2.is_moe_layer(1) and not every2.is_moe_layer(0)
    first3 = load_model(write(tmp_path, {**QWEN15_MOE_A27B, "mlp_only_layers": [0, 1, 2]}, "b"))
    assert first3.num_moe_layers == 21 and not first3.is_moe_layer(2)
    with pytest.raises(HaapInputError, match="mlp_only_layers"):
        load_model(write(tmp_path, {**QWEN15_MOE_A27B, "mlp_only_layers": [3, 7]}, "c"))


def test_moe_layer_count_closed_form_matches_the_layers() -> None:
    """``num_moe_layers`` (closed form) is the count of ``is_moe_layer`` over the layers, for every catalog model and
    for each pattern at layer counts that do and do not divide by k."""
    from haap_milp.catalog.data import model_names

    specs = [load_model(n) for n in model_names()]
    moe = next(s for s in specs if s.is_moe)
    for n in (1, 5, 6, 7, 48, 61):
        for k in (1, 2, 3, 4):
            specs.append(moe.model_copy(update={"num_layers": n, "moe_layer_pattern": "every_k", "moe_layer_freq": k}))
            if k < n:
                specs.append(moe.model_copy(update={"num_layers": n, "moe_layer_pattern": "first_k_dense",
                                                    "first_k_dense": k}))
    for spec in specs:
        assert spec.num_moe_layers == sum(spec.is_moe_layer(i) for i in range(spec.num_layers)), spec.name


def test_model_type_without_architectures(tmp_path: Path) -> None:
    cfg = {k: v for k, v in LLAMA3_8B.items() if k != "architectures"}
    assert load_model(write(tmp_path, cfg)).num_params_total == load_model("llama3-8b").num_params_total


@pytest.mark.parametrize("cfg,needle", [
    ({"architectures": ["FalconForCausalLM"], "hidden_size": 7168}, "'FalconForCausalLM' is not supported"),
    ({"model_type": "bert", "hidden_size": 768}, "model_type 'bert' is not supported"),
    ({"architectures": "LlamaForCausalLM"}, "field 'architectures'"),
    ({**LLAMA3_8B, "hidden_size": "4096"}, "field 'hidden_size' = '4096'"),
    ({**LLAMA3_8B, "num_key_value_heads": 0}, "field 'num_key_value_heads' = 0"),
    ({**LLAMA3_8B, "num_key_value_heads": 5}, "num_key_value_heads=5 does not divide num_attention_heads=32"),
    ({**LLAMA3_8B, "num_attention_heads": 30}, "num_attention_heads=30 does not divide hidden_size=4096"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "intermediate_size"}, "no 'intermediate_size'"),
    ({**LLAMA3_8B, "tie_word_embeddings": "yes"}, "field 'tie_word_embeddings'"),
    ({**GPT2, "activation_function": "swish"}, "field 'activation_function' = 'swish'"),
    ({**LLAMA3_8B, "rms_norm_eps": -1}, "field 'rms_norm_eps' = -1"),
    ([1, 2, 3], "should be a mapping"),
])
def test_bad_configs_are_one_paragraph(tmp_path: Path, cfg: Any, needle: str) -> None:
    with pytest.raises(HaapInputError) as exc:
        load_model(write(tmp_path, cfg))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_unsupported_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    with pytest.raises(HaapInputError) as exc:
        load_model(write(tmp_path, {"architectures": ["GemmaForCausalLM"]}))
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GPT2LMHeadModel",
                 "GPTNeoXForCausalLM", "OPTForCausalLM"):
        assert arch in str(exc.value)


def test_rope_base_and_qk_norm_come_from_the_config(tmp_path: Path) -> None:
    """The emitters write the RoPE base and Qwen3's q/k norm: an imported config carries its own (every config got
    rope base 10000 and no q/k norm before; a Llama-3 config emitted --rotary-base 10000)."""
    qwen3 = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
             "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 36, "head_dim": 128,
             "vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06}
    spec = load_model(write(tmp_path, qwen3))
    assert (spec.qk_norm, spec.rope_base, spec.norm_epsilon) == (True, 1e6, 1e-6)
    spec = load_model(write(tmp_path, {**LLAMA3_8B, "rope_theta": 500000.0}, "l3"))
    assert (spec.qk_norm, spec.rope_base) == (False, 500000.0)
