"""Which torchtitan model runs a ``ModelSpec``: a registry flavor equal to it, a definition built with the
family's own builders (torchtitan 0.3.0), or a refusal naming the architecture feature torchtitan lacks.

torchtitan builds models from Python config objects (``Decoder.Config`` trees). Two outcomes run:

* **registry**: every shape and architecture field equals one of its flavors (``FLAVORS``) ->
  ``model_registry(<flavor>)`` (both engine versions; the only form the 0.1 TOML can name);
* **built** (0.3 only): the family's layer builder called with the model's own shapes, in the emitted
  ``haap_model()``; the registry flavor's ``ModelSpec`` supplies parallelize / pipelining / hooks
  (``dataclasses.replace``), and the loss's ``global_vocab_size`` follows the model's vocabulary.

Families and what they fix (torchtitan 0.3.0, files in the ``torchtitan`` package):

* ``llama3``: ``models/llama3/__init__.py:69-111`` ``_build_llama3_layers`` (RMSNorm at the default eps 1e-5,
  ``models/common/nn_modules.py:140``; no head_dim argument, so head_dim = dim / heads; GQA; SwiGLU),
  ``ComplexRoPE`` (``models/common/rope.py:180``), dense only;
* ``qwen3``: ``models/qwen3/__init__.py:91-194`` ``_build_qwen3_layers`` / ``_build_qwen3_moe_layers``
  (RMSNorm eps 1e-6 ``_EPS`` at :63, q/k-norm always at :121,:170, explicit head_dim, MoE on every layer,
  softmax top-k router with renormalised weights, no shared experts), ``CosSinRoPE`` (``rope.py:268``).

Refused, with the reason: GELU/ReLU MLPs (``models/common/feed_forward.py:54`` is SwiGLU), LayerNorm, learned
positions, linear biases (``models/common/linear.py:33`` bias=False; ``config_utils.py:187-279``
``make_gqa_config`` has no bias option, so no Q/K/V bias either), MoE without q/k-norm (its MoE decoders are
qwen3, deepseek_v3 with MLA attention, gpt_oss with attention sinks and biases:
``models/gpt_oss/__init__.py:97-125``), MoE with shared experts, dense layers or a capacity factor.
"""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.specs import ModelSpec


@dataclass(frozen=True)
class Flavor:
    """A torchtitan registry model and the ModelSpec fields it fixes."""

    module: str  # torchtitan.models.<module>
    flavor: str  # model_registry(<flavor>) / [model] flavor
    config_fn: str  # config_registry function that builds the trainer config around it (0.3)
    source: str  # where the shapes were read (torchtitan 0.3.0)
    shape: tuple[tuple[str, object], ...]


_LLAMA3 = (("activation", "swiglu"), ("norm", "rmsnorm"), ("positions", "rope"), ("rope_base", 500000.0),
           ("bias_linear", False), ("qkv_bias", False), ("qk_norm", False), ("tied_embeddings", False),
           ("num_experts", 0), ("vocab_size", 128256), ("norm_epsilon", 1e-5))
FLAVORS = (
    Flavor("llama3", "8B", "llama3_8b", "torchtitan/models/llama3/__init__.py:236-274",
           (("num_layers", 32), ("hidden", 4096), ("num_heads", 32), ("kv_heads", 8), ("dim_head", 128),
            ("ffn_hidden", 14336), *_LLAMA3)),
    Flavor("llama3", "70B", "llama3_70b", "torchtitan/models/llama3/__init__.py:277-315",
           (("num_layers", 80), ("hidden", 8192), ("num_heads", 64), ("kv_heads", 8), ("dim_head", 128),
            ("ffn_hidden", 28672), *_LLAMA3)),
    # llama3_405b() adds a float8 converter and compile (llama3/config_registry.py:295-347), not the plan's bf16:
    # its trainer components come from llama3_8b() instead
    Flavor("llama3", "405B", "llama3_8b", "torchtitan/models/llama3/__init__.py:318-356",
           (("num_layers", 126), ("hidden", 16384), ("num_heads", 128), ("kv_heads", 8), ("dim_head", 128),
            ("ffn_hidden", 53248), *_LLAMA3)),
    # torchtitan's 235B-A22B has rope theta 5e6 (models/qwen3/__init__.py:557-595, the 2507 release); the
    # catalog model (HF Qwen/Qwen3-235B-A22B) has 1e6, so it is built, not taken from the registry.
    Flavor("qwen3", "235B-A22B", "qwen3_30b_a3b", "torchtitan/models/qwen3/__init__.py:557-595",
           (("num_layers", 94), ("hidden", 4096), ("num_heads", 64), ("kv_heads", 4), ("dim_head", 128),
            ("num_experts", 128), ("top_k", 8), ("expert_ffn", 1536), ("vocab_size", 151936),
            ("activation", "swiglu"), ("norm", "rmsnorm"), ("positions", "rope"), ("rope_base", 5000000.0),
            ("bias_linear", False), ("qkv_bias", False), ("qk_norm", True), ("tied_embeddings", False),
            ("num_shared_experts", 0), ("capacity_factor", None), ("norm_epsilon", 1e-6))),
)


@dataclass(frozen=True)
class ModelChoice:
    """How the emitted config gets its model (see the module docstring)."""

    family: str  # torchtitan.models.<family>
    flavor: str  # registry flavor, or "haap:<model name>" when built
    config_fn: str  # the family's config_registry function supplying trainer components
    base_flavor: str  # registry flavor whose ModelSpec callables a built model reuses
    source: str  # torchtitan file:line the definition follows
    body: tuple[str, ...] = ()  # lines of haap_model() (built models only)
    imports: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (module, names) for haap_model()

    @property
    def built(self) -> bool:
        return bool(self.body)


def match_flavor(model: ModelSpec) -> tuple[Flavor | None, str]:
    """The registry flavor equal to ``model`` on every field, else None and the closest flavor's first difference."""
    best, why = None, ""
    for fl in FLAVORS:
        diffs = [(k, v, getattr(model, k)) for k, v in fl.shape if getattr(model, k) != v]
        if not diffs:
            return fl, ""
        if best is None or len(diffs) < best:
            best = len(diffs)
            k, want, got = diffs[0]
            why = f"closest is {fl.module} {fl.flavor} ({fl.source}), which has {k}={want!r}, the model {got!r}"
    return None, why


def architecture_refusal(model: ModelSpec) -> str | None:
    """Why no torchtitan 0.3.0 family builds ``model`` (None: one does)."""
    if model.is_mla:
        return ("multi-head latent attention: haap emits torchtitan's llama3 and qwen3 families, whose attention is "
                "GQA; torchtitan's deepseek_v3 family is not emitted")
    if model.activation != "swiglu":
        return f"activation {model.activation}: torchtitan's decoder MLP is SwiGLU only (models/common/feed_forward.py:54)"
    if model.norm != "rmsnorm":
        return f"normalization {model.norm}: torchtitan's decoders use RMSNorm only (models/common/nn_modules.py:134)"
    if model.positions != "rope":
        return f"position embedding {model.positions}: torchtitan's decoders use RoPE only (models/common/rope.py:85)"
    if model.bias_linear or model.qkv_bias:
        return ("linear biases (Q/K/V or MLP): torchtitan's llama3/qwen3 attention and MLP are bias-free "
                "(models/common/linear.py:33, make_gqa_config in models/common/config_utils.py:187-279)")
    if model.qk_norm:
        return _qwen3_refusal(model)
    if model.is_moe:
        return ("MoE without q/k-norm: torchtitan's MoE decoders are qwen3 (q/k-norm always, "
                "models/qwen3/__init__.py:170), deepseek_v3 (MLA attention) and gpt_oss (attention sinks and "
                "biases, models/gpt_oss/__init__.py:97-125)")
    if model.norm_epsilon != 1e-5:
        return (f"norm epsilon {model.norm_epsilon}: torchtitan's llama3 layers use RMSNorm's default 1e-5 "
                "(models/llama3/__init__.py:87-90, models/common/nn_modules.py:140)")
    if model.dim_head * model.num_heads != model.hidden:
        return (f"head_dim {model.dim_head} != hidden/heads: torchtitan's llama3 layers derive it "
                "(models/llama3/__init__.py:69-111)")
    return None


def _qwen3_refusal(model: ModelSpec) -> str | None:
    if model.norm_epsilon != 1e-6:
        return (f"q/k-norm with norm epsilon {model.norm_epsilon}: torchtitan's qwen3 layers fix 1e-6 "
                "(models/qwen3/__init__.py:63)")
    if model.is_moe and (model.moe_layer_pattern != "all" or model.num_shared_experts or model.capacity_factor):
        return ("MoE with dense layers, shared experts or a capacity factor: torchtitan's qwen3 MoE has routed "
                "experts on every layer, dropless (models/qwen3/__init__.py:134-194)")
    return None


def _rope(model: ModelSpec, family: str, seq_len: int) -> str:
    cls = "ComplexRoPE" if family == "llama3" else "CosSinRoPE"
    # max_seq_len only sizes the precomputed table; scaling "none": ModelSpec has no RoPE scaling field
    return (f'{cls}.Config(dim={model.dim_head}, max_seq_len={max(seq_len, model.seq_len)}, '
            f'theta={float(model.rope_base)!r})')


def _llama3_body(model: ModelSpec, seq_len: int) -> tuple[str, ...]:
    return (
        f"    dim, vocab = {model.hidden}, {model.vocab_size}",
        "    return Llama3Model.Config(",
        f"        dim=dim, vocab_size=vocab, enable_weight_tying={model.tied_embeddings},",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),",
        f"        norm=RMSNorm.Config(normalized_shape=dim, eps={model.norm_epsilon!r}, param_init=_NORM_INIT),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),",
        (f"        layers=_build_llama3_layers(fuse_qkv=True, n_layers={model.num_layers}, dim=dim, "
        f"n_heads={model.num_heads}, n_kv_heads={model.kv_heads},"),
        f"                                    hidden_dim={model.ffn_hidden}, attn_backend=\"flex\",",
        f"                                    rope={_rope(model, 'llama3', seq_len)}),",
        "    )",
    )


def _qwen3_body(model: ModelSpec, seq_len: int) -> tuple[str, ...]:
    common = (f"fuse_qkv=True, n_layers={model.num_layers}, dim=dim, n_heads={model.num_heads}, "
              f"n_kv_heads={model.kv_heads}, head_dim={model.dim_head},")
    if model.is_moe:
        layers = (f"        layers=_build_qwen3_moe_layers({common}",
                  (f"            moe_hidden_dim={model.expert_ffn}, num_experts={model.num_experts}, "
                  f"top_k={model.top_k}, attn_backend=\"flex\", moe_comm_backend=\"standard\","))
    else:
        layers = (f"        layers=_build_qwen3_layers({common}",
                  f"            hidden_dim={model.ffn_hidden}, attn_backend=\"flex\",")
    return (
        f"    dim, vocab = {model.hidden}, {model.vocab_size}",
        "    return Qwen3Model.Config(",
        f"        dim=dim, vocab_size=vocab, enable_weight_tying={model.tied_embeddings}, norm=_qwen3_norm(dim),",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_LINEAR_INIT),",
        *layers,
        f"            rope={_rope(model, 'qwen3', seq_len)}),",
        "    )",
    )


# names each built family's haap_model() imports (builders of torchtitan 0.3.0 models/<family>/__init__.py)
_IMPORTS = {
    "llama3": (("torchtitan.models.common", ("ComplexRoPE", "Embedding", "Linear", "RMSNorm")),
               ("torchtitan.models.llama3", ("Llama3Model", "_EMBEDDING_INIT", "_NORM_INIT", "_build_llama3_layers",
                                             "_output_linear_init"))),
    "qwen3": (("torchtitan.models.common", ("CosSinRoPE", "Embedding", "Linear")),
              ("torchtitan.models.qwen3", ("Qwen3Model", "_EMBEDDING_INIT", "_LINEAR_INIT", "_qwen3_norm"))),
}


def choose(model: ModelSpec, seq_len: int, version: str) -> ModelChoice | str:
    """The torchtitan model for ``model`` (engine ``version``), or why there is none."""
    flavor, why = match_flavor(model)
    if flavor is not None:
        return ModelChoice(flavor.module, flavor.flavor, flavor.config_fn, flavor.flavor, flavor.source)
    refusal = architecture_refusal(model)
    if refusal:
        return f"torchtitan 0.3.0 has no model with {refusal}"
    if version != "0.3":
        return (f"the {version} TOML form names registry flavors only and none is {model.name} ({why}); "
                "the default --engine-version builds it")
    if model.qk_norm:
        moe = model.is_moe
        return ModelChoice("qwen3", f"haap:{model.name}", "qwen3_30b_a3b" if moe else "qwen3_14b",
                           "30B-A3B" if moe else "14B", "torchtitan/models/qwen3/__init__.py:91-194",
                           _qwen3_body(model, seq_len), (*_IMPORTS["qwen3"], (
                               "torchtitan.models.qwen3", ("_build_qwen3_moe_layers" if moe else "_build_qwen3_layers",))))
    return ModelChoice("llama3", f"haap:{model.name}", "llama3_8b", "8B", "torchtitan/models/llama3/__init__.py:69-111",
                       _llama3_body(model, seq_len), _IMPORTS["llama3"])


__all__ = ["FLAVORS", "Flavor", "ModelChoice", "architecture_refusal", "choose", "match_flavor"]
