"""Hugging Face ``config.json`` -> ModelSpec for the decoder-only architectures we model.

Keys follow each architecture's ``configuration_*.py`` in huggingface/transformers (defaults
as there). Unknown keys are ignored (HF configs carry many runtime settings).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from haap_milp.catalog.files import require_mapping, short
from haap_milp.catalog.validation import validate_spec
from haap_milp.errors import HaapInputError
from haap_milp.specs import ModelSpec

log = logging.getLogger(__name__)

# Longest default seq_len taken from max_position_embeddings: context windows beyond it are
# long-context extensions (RoPE scaling), not the pre-training length (Llama 3: 8192, paper Sec. 3.4).
MAX_DEFAULT_SEQ_LEN = 8192
GELU_NAMES = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "quick_gelu")
_MISSING = object()


class _Cfg:
    """Typed access to one HF config with errors naming the key."""

    def __init__(self, data: dict[str, Any], name: str, arch: str):
        self.data, self.name, self.arch = data, name, arch

    def error(self, key: str, value: Any, want: str) -> HaapInputError:
        return HaapInputError(f"HF config {self.name!r} ({self.arch}): field '{key}' = {short(value)}: expected {want}.",
                              field=key, value=value)

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1) -> int:
        value = self.data.get(key, default)
        if value is None and default is not _MISSING:
            value = default
        if value is _MISSING:
            raise HaapInputError(f"HF config {self.name!r} ({self.arch}) has no '{key}'; it is required for this "
                                 "architecture.", field=key)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.error(key, value, f"a whole number >= {minimum}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, value, "true or false")
        return value

    def activation(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if value == "relu":
            return "relu"
        if value in GELU_NAMES:
            return "gelu"
        raise self.error(key, value, f"one of relu, {', '.join(GELU_NAMES)}")

    def seq_len(self, key: str, default: int) -> int:
        return min(self.int(key, default), MAX_DEFAULT_SEQ_LEN)


def _llama(c: _Cfg) -> dict[str, Any]:
    """Llama/Mistral/Qwen2/Qwen3 shapes; their MLP is always gated (3 matrices) -> 'swiglu'."""
    heads = c.int("num_attention_heads")
    return {
        "num_layers": c.int("num_hidden_layers"), "hidden": c.int("hidden_size"), "num_heads": heads,
        "num_kv_heads": c.int("num_key_value_heads", heads),
        "head_dim": None if c.data.get("head_dim") is None else c.int("head_dim"),
        "ffn_hidden": c.int("intermediate_size"),
        "vocab_size": c.int("vocab_size"), "seq_len": c.seq_len("max_position_embeddings", 2048),
        "activation": "swiglu", "tied_embeddings": c.bool("tie_word_embeddings", False),
        "qkv_bias": c.bool("attention_bias", False),
    }


def _mixtral(c: _Cfg) -> dict[str, Any]:
    return {**_llama(c), "num_experts": c.int("num_local_experts", 8), "top_k": c.int("num_experts_per_tok", 2)}


def _qwen2(c: _Cfg) -> dict[str, Any]:
    return {**_llama(c), "qkv_bias": True}  # Qwen2 attention: q/k/v Linear(bias=True) always


def _moe_layers(c: _Cfg, num_layers: int) -> dict[str, Any]:
    """decoder_sparse_step k: layer i is MoE iff (i+1) % k == 0; mlp_only_layers must be a prefix."""
    step = c.int("decoder_sparse_step", 1)
    dense = c.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise c.error("mlp_only_layers", dense, "a list of layer indices")
    if dense and (step != 1 or sorted(dense) != list(range(len(dense))) or len(dense) >= num_layers):
        raise c.error("mlp_only_layers", dense, "dense layers forming a prefix 0..k-1 (with decoder_sparse_step 1); "
                      "other layouts are not modelled")
    if dense:
        return {"moe_layer_pattern": "first_k_dense", "first_k_dense": len(dense)}
    return {"moe_layer_pattern": "every_k", "moe_layer_freq": step} if step > 1 else {}


def _qwen_moe(c: _Cfg, shared: bool) -> dict[str, Any]:
    out = {**_llama(c), "num_experts": c.int("num_experts"), "top_k": c.int("num_experts_per_tok"),
           "moe_ffn_hidden": c.int("moe_intermediate_size")}
    out.update(_moe_layers(c, out["num_layers"]))
    if shared and c.data.get("shared_expert_intermediate_size"):
        out.update(num_shared_experts=1, shared_expert_ffn_hidden=c.int("shared_expert_intermediate_size"))
    return out


def _qwen2_moe(c: _Cfg) -> dict[str, Any]:
    # Qwen2-MoE: one shared expert of shared_expert_intermediate_size; its sigmoid gate (hidden x 1) is not counted.
    return {**_qwen_moe(c, shared=True), "qkv_bias": True}


def _qwen3(c: _Cfg) -> dict[str, Any]:
    return {**_llama(c), "qk_norm": True}  # Qwen3 attention: RMSNorm on each head's q and k (q_norm, k_norm) always


def _qwen3_moe(c: _Cfg) -> dict[str, Any]:
    return {**_qwen_moe(c, shared=False), "qk_norm": True}


def _deepseek(c: _Cfg) -> dict[str, Any]:
    """DeepSeek-V2 / V3 (``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM``): multi-head latent attention
    (q_lora_rank null = no query compression, as in V2-Lite), n_routed_experts of moe_intermediate_size, top
    num_experts_per_tok, n_shared_experts of the same size, the first first_k_dense_replace layers dense with
    intermediate_size, moe_layer_freq 1. The MTP module of V3 (num_nextn_predict_layers) is not part of the model
    here (the 671B of the report exclude it)."""
    heads = c.int("num_attention_heads")
    kv = c.data.get("num_key_value_heads")
    if kv is not None and c.int("num_key_value_heads") != heads:
        raise c.error("num_key_value_heads", kv, f"equal to num_attention_heads ({heads}) under MLA")
    if c.int("moe_layer_freq", 1) != 1:
        raise c.error("moe_layer_freq", c.data.get("moe_layer_freq"), "1 (other layouts are not modelled)")
    layers, dense = c.int("num_hidden_layers"), c.int("first_k_dense_replace", 0, minimum=0)
    out = {"num_layers": layers, "hidden": c.int("hidden_size"), "num_heads": heads,
           "ffn_hidden": c.int("intermediate_size"), "vocab_size": c.int("vocab_size"),
           "seq_len": c.seq_len("max_position_embeddings", 4096), "activation": "swiglu",
           "tied_embeddings": c.bool("tie_word_embeddings", False), "qkv_bias": c.bool("attention_bias", False),
           "q_lora_rank": None if c.data.get("q_lora_rank") is None else c.int("q_lora_rank"),
           "kv_lora_rank": c.int("kv_lora_rank"), "qk_nope_head_dim": c.int("qk_nope_head_dim"),
           "qk_rope_head_dim": c.int("qk_rope_head_dim"), "v_head_dim": c.int("v_head_dim")}
    if c.data.get("n_routed_experts"):
        experts = c.int("n_routed_experts")
        out.update(num_experts=experts, top_k=c.int("num_experts_per_tok"), moe_ffn_hidden=c.int("moe_intermediate_size"),
                   num_shared_experts=c.int("n_shared_experts", 0, minimum=0))
        if dense:
            out.update(moe_layer_pattern="first_k_dense", first_k_dense=dense)
    return out


def _gpt2(c: _Cfg) -> dict[str, Any]:
    hidden = c.int("n_embd", 768)
    return {"num_layers": c.int("n_layer", 12), "hidden": hidden, "num_heads": c.int("n_head", 12),
            "ffn_hidden": c.int("n_inner", 4 * hidden), "vocab_size": c.int("vocab_size", 50257),
            "seq_len": c.seq_len("n_positions", 1024), "activation": c.activation("activation_function", "gelu_new"),
            "tied_embeddings": True, "qkv_bias": True}


def _gpt_neox(c: _Cfg) -> dict[str, Any]:
    return {"num_layers": c.int("num_hidden_layers"), "hidden": c.int("hidden_size"),
            "num_heads": c.int("num_attention_heads"), "ffn_hidden": c.int("intermediate_size"),
            "vocab_size": c.int("vocab_size"), "seq_len": c.seq_len("max_position_embeddings", 2048),
            "activation": c.activation("hidden_act", "gelu"), "tied_embeddings": c.bool("tie_word_embeddings", False),
            "qkv_bias": c.bool("attention_bias", True)}


def _opt(c: _Cfg) -> dict[str, Any]:
    hidden = c.int("hidden_size")
    proj = c.int("word_embed_proj_dim", hidden)
    if proj != hidden:  # approximation documented for opt-350m in models.yaml
        log.info("OPT word_embed_proj_dim %d != hidden %d: embedding modelled %d wide (over-counts)", proj, hidden,
                 hidden)
    return {"num_layers": c.int("num_hidden_layers"), "hidden": hidden, "num_heads": c.int("num_attention_heads"),
            "ffn_hidden": c.int("ffn_dim"), "vocab_size": c.int("vocab_size"),
            "seq_len": c.seq_len("max_position_embeddings", 2048),
            "activation": c.activation("activation_function", "relu"),
            "tied_embeddings": c.bool("tie_word_embeddings", True), "qkv_bias": c.bool("enable_bias", True)}


def _gpt_neo(c: _Cfg) -> dict[str, Any]:
    hidden = c.int("hidden_size")
    return {"num_layers": c.int("num_layers"), "hidden": hidden, "num_heads": c.int("num_heads"),
            "ffn_hidden": c.int("intermediate_size", 4 * hidden), "vocab_size": c.int("vocab_size"),
            "seq_len": c.seq_len("max_position_embeddings", 2048),
            "activation": c.activation("activation_function", "gelu_new"), "tied_embeddings": True,
            "qkv_bias": False}


ARCHITECTURES: dict[str, Callable[[_Cfg], dict[str, Any]]] = {
    "LlamaForCausalLM": _llama, "MistralForCausalLM": _llama, "MixtralForCausalLM": _mixtral,
    "Qwen2ForCausalLM": _qwen2, "Qwen2MoeForCausalLM": _qwen2_moe, "Qwen3ForCausalLM": _qwen3,
    "Qwen3MoeForCausalLM": _qwen3_moe, "GPT2LMHeadModel": _gpt2, "GPTNeoXForCausalLM": _gpt_neox,
    "OPTForCausalLM": _opt, "GPTNeoForCausalLM": _gpt_neo, "DeepseekV2ForCausalLM": _deepseek,
    "DeepseekV3ForCausalLM": _deepseek,
}
MODEL_TYPES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM", "gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM",
    "opt": "OPTForCausalLM", "gpt_neo": "GPTNeoForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}


def is_hf_config(data: Any) -> bool:
    return isinstance(data, dict) and ("architectures" in data or "model_type" in data)


def _architecture(data: dict[str, Any], name: str) -> str:
    supported = ", ".join(ARCHITECTURES)
    archs = data.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise HaapInputError(f"HF config {name!r}: field 'architectures' = {short(archs)}: expected a list of "
                                 f"architecture names; supported: {supported}.", field="architectures", value=archs)
        for arch in archs:
            if arch in ARCHITECTURES:
                return arch
        raise HaapInputError(f"HF config {name!r}: architecture {short(', '.join(archs))} is not supported; supported: "
                             f"{supported} (or write a model YAML, see `haap-solve schema model`).",
                             field="architectures", value=archs)
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    raise HaapInputError(f"HF config {name!r}: model_type {short(model_type)} is not supported and 'architectures' is "
                         f"absent; supported architectures: {supported}.", field="model_type", value=model_type)


def model_from_hf(data: Any, name: str, where: str = "") -> ModelSpec:
    """ModelSpec from a parsed HF config.json; ``name`` is the display name, ``where`` the file (for errors)."""
    where = where or name
    data = require_mapping(data, where, "a Hugging Face config.json")
    arch = _architecture(data, where)
    fields = ARCHITECTURES[arch](_Cfg(data, where, arch))
    for field in ("norm_epsilon", "rope_base"):  # (the emitters write them: Megatron's --norm-epsilon and
        # --rotary-base, torchtitan's RMSNorm eps and RoPE theta; every config got 1e-5 and 10000 before)
        value = next((data[k] for k in HF_KEYS[field] if data.get(k) is not None), None)
        if value is not None:  # (ModelSpec bounds it; a bad value is said in the config's key below)
            fields[field] = value
    display = name if 1 <= len(name) <= 200 else name[:197] + "..."
    try:
        return validate_spec(ModelSpec, {"name": display, **fields}, f"HF config {where!r} ({arch})")
    except HaapInputError as exc:
        raise _in_hf_terms(exc, data) from None


#: haap ModelSpec field -> the HF config keys it is read from (first present wins), for error messages
HF_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"), "hidden": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"), "num_kv_heads": ("num_key_value_heads",),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim"), "vocab_size": ("vocab_size",),
    "seq_len": ("max_position_embeddings", "n_positions"), "head_dim": ("head_dim",),
    "num_experts": ("num_local_experts", "num_experts"), "top_k": ("num_experts_per_tok",),
    "expert_ffn": ("moe_intermediate_size",), "shared_expert_ffn": ("shared_expert_intermediate_size",),
    "norm_epsilon": ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"),
    "rope_base": ("rope_theta", "rotary_emb_base"),
}


def _in_hf_terms(exc: HaapInputError, data: dict[str, Any]) -> HaapInputError:
    """The same paragraph with haap's field names replaced by the config's own keys."""
    text = str(exc)
    field = exc.field
    for ours, theirs in HF_KEYS.items():
        key = next((k for k in theirs if k in data), None)
        if key is None or key == ours:
            continue
        text = re.sub(rf"(?<![\w.]){ours}(?![\w])", key, text)
        if field == ours:
            field = key
    return HaapInputError(text, field=field, value=exc.value)
