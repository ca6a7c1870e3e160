"""The model: a decoder-only transformer, dense or Mixture-of-Experts.

Units and conventions: see ``haap_milp.specs`` (the package docstring)."""

from __future__ import annotations

from functools import cached_property

from pydantic import Field, computed_field, model_validator

from haap_milp.specs.base import (
    Activation,
    Frozen,
    MoeLayerPattern,
    Name,
    Normalization,
    PositionEmbedding,
)


class ModelSpec(Frozen):
    """A decoder-only transformer, dense or Mixture-of-Experts."""

    name: Name = Field(description="Display name, e.g. 'llama3-70b'.", min_length=1, max_length=200)
    num_layers: int = Field(description="Number of decoder layers.", ge=1, le=10_000)
    hidden: int = Field(description="Hidden size h (model dimension).", ge=1, le=1_000_000)
    ffn_hidden: int = Field(
        description="Dense MLP inner size (per layer, for dense layers).", ge=1, le=10_000_000
    )
    num_heads: int = Field(description="Attention (query) heads.", ge=1, le=100_000)
    num_kv_heads: int | None = Field(
        default=None,
        description="Key/value heads (GQA/MQA); None means equal to num_heads (MHA).",
        ge=1,
        le=100_000,
    )
    head_dim: int | None = Field(
        default=None, description="Per-head dimension; None means hidden // num_heads.", ge=1, le=100_000
    )
    vocab_size: int = Field(description="Vocabulary size V.", ge=1, le=100_000_000)
    seq_len: int = Field(default=2048, description="Default training sequence length (tokens).", ge=1, le=100_000_000)
    activation: Activation = Field(
        default="swiglu", description="MLP activation: swiglu (3 matrices) or gelu/relu (2 matrices)."
    )
    tied_embeddings: bool = Field(default=False, description="Input embedding and LM head share weights.")
    qkv_bias: bool = Field(default=False, description="Q/K/V projections carry a bias (Qwen2, GPT-2, OPT).")
    # --- architecture details the launch files need (not the cost model); None: the swiglu/llama-style default
    normalization: Normalization | None = Field(
        default=None, description="Norm layer; None means rmsnorm for swiglu models, layernorm otherwise."
    )
    norm_epsilon: float = Field(default=1e-5, description="Epsilon of the norm layers.", gt=0, le=1)
    position_embedding: PositionEmbedding | None = Field(
        default=None, description="Position embedding; None means rope for swiglu models, learned otherwise."
    )
    rope_base: float = Field(default=10000.0, description="RoPE base (theta), when position_embedding is rope.",
                             gt=0, le=1e12)
    linear_bias: bool | None = Field(
        default=None, description="Biases on the attention output and MLP linears; None means not swiglu."
    )
    qk_norm: bool = Field(default=False, description="RMS/LayerNorm on per-head queries and keys (Qwen3).")
    moe_aux_loss_coeff: float = Field(default=0.0, description="Router load-balancing loss coefficient.", ge=0)
    # --- Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank None means ordinary MHA/GQA attention)
    q_lora_rank: int | None = Field(
        default=None, description="MLA: rank of the query down-projection; None means no query compression.",
        ge=1, le=1_000_000)
    kv_lora_rank: int | None = Field(
        default=None, description="MLA: rank of the compressed key/value latent; None means no MLA.", ge=1,
        le=1_000_000)
    qk_nope_head_dim: int | None = Field(default=None, description="MLA: per-head query/key dim without RoPE.",
                                         ge=1, le=100_000)
    qk_rope_head_dim: int | None = Field(default=None, description="MLA: per-head query/key RoPE dim (the RoPE key "
                                         "is one per token, shared by the heads).", ge=1, le=100_000)
    v_head_dim: int | None = Field(default=None, description="MLA: per-head value dim.", ge=1, le=100_000)
    # --- Mixture of Experts (num_experts == 0 means dense)
    num_experts: int = Field(default=0, description="Routed experts per MoE layer; 0 for a dense model.", ge=0, le=100_000)
    top_k: int = Field(default=0, description="Routed experts activated per token.", ge=0, le=1024)
    moe_ffn_hidden: int | None = Field(
        default=None, description="Inner size of one routed expert; None means ffn_hidden.", ge=1, le=10_000_000
    )
    num_shared_experts: int = Field(default=0, description="Always-active shared experts per MoE layer.", ge=0, le=1024)
    shared_expert_ffn_hidden: int | None = Field(
        default=None, description="Inner size of one shared expert; None means moe_ffn_hidden.", ge=1, le=10_000_000
    )
    moe_layer_pattern: MoeLayerPattern = Field(
        default="all", description="Which decoder layers are MoE: all, every k-th, or all but the first k."
    )
    moe_layer_freq: int = Field(default=1, description="k for pattern every_k (layer i is MoE iff i % k == k-1).", ge=1)
    first_k_dense: int = Field(default=0, description="k for pattern first_k_dense.", ge=0)
    capacity_factor: float | None = Field(
        default=None, description="Expert capacity factor; None means dropless routing.", gt=0, le=64
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        if self.hidden % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide hidden={self.hidden}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_kv_heads={self.kv_heads} does not divide num_heads={self.num_heads}")
        if self.num_experts:
            if "top_k" not in self.model_fields_set:  # (not "top_k=0": a value the file never wrote)
                raise ValueError(f"num_experts={self.num_experts} needs top_k, the routed experts each token "
                                 f"activates (1 to {self.num_experts}); it is missing")
            if not 1 <= self.top_k <= self.num_experts:
                raise ValueError(f"top_k={self.top_k} must be between 1 and num_experts={self.num_experts}")
            if self.moe_layer_pattern == "first_k_dense" and self.first_k_dense >= self.num_layers:
                raise ValueError(f"first_k_dense={self.first_k_dense} leaves no MoE layer of {self.num_layers}")
        elif self.top_k or self.num_shared_experts:
            raise ValueError("top_k / num_shared_experts given for a dense model (num_experts=0)")
        mla = (self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim)
        if self.kv_lora_rank is not None and None in mla:
            raise ValueError("kv_lora_rank (multi-head latent attention) needs qk_nope_head_dim, qk_rope_head_dim "
                             "and v_head_dim")
        if self.kv_lora_rank is None and (self.q_lora_rank is not None or any(x is not None for x in mla)):
            raise ValueError("q_lora_rank / qk_nope_head_dim / qk_rope_head_dim / v_head_dim describe multi-head "
                             "latent attention and need kv_lora_rank")
        if self.kv_lora_rank is not None and self.num_kv_heads not in (None, self.num_heads):
            raise ValueError("multi-head latent attention has one key/value head per query head; leave "
                             "num_kv_heads unset")
        return self

    # ---- derived shapes
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def norm(self) -> str:
        """rmsnorm | layernorm (``normalization``, defaulted from the activation)."""
        return self.normalization or ("rmsnorm" if self.activation == "swiglu" else "layernorm")

    @property
    def positions(self) -> str:
        """rope | learned | none (``position_embedding``, defaulted from the activation)."""
        return self.position_embedding or ("rope" if self.activation == "swiglu" else "learned")

    @property
    def bias_linear(self) -> bool:
        """Biases on the attention output and MLP linears (``linear_bias``, defaulted from the activation)."""
        return self.activation != "swiglu" if self.linear_bias is None else self.linear_bias

    @property
    def dim_head(self) -> int:
        """Per-head dim (MLA: the query/key dim, nope + rope)."""
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim or self.hidden // self.num_heads

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2 sec. 2.1): keys and values up-projected from a latent."""
        return self.kv_lora_rank is not None

    @property
    def q_width(self) -> int:
        """Query width per token (all heads): heads x (MLA: nope + rope) dim."""
        return self.num_heads * self.dim_head

    @property
    def k_width(self) -> int:
        """Key width per token the core attention reads (MLA: the up-projected keys, one per head)."""
        return self.num_heads * self.dim_head if self.is_mla else self.kv_heads * self.dim_head

    @property
    def v_width(self) -> int:
        """Value width per token (all value heads) = the core attention's output width per query head set."""
        return self.num_heads * self.v_head_dim if self.is_mla else self.kv_heads * self.dim_head

    @property
    def attn_out_width(self) -> int:
        """Width of the core attention's output = the output projection's input (heads x value dim)."""
        return self.num_heads * (self.v_head_dim if self.is_mla else self.dim_head)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden or self.expert_ffn

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in one MLP: 3 for SwiGLU (gate, up, down), 2 otherwise."""
        return 3 if self.activation == "swiglu" else 2

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer ``i`` (0-based) is an MoE layer."""
        if not self.is_moe:
            return False
        if self.moe_layer_pattern == "every_k":
            return i % self.moe_layer_freq == self.moe_layer_freq - 1
        if self.moe_layer_pattern == "first_k_dense":
            return i >= self.first_k_dense
        return True

    @property
    def num_moe_layers(self) -> int:
        """The count of ``is_moe_layer`` over the layers, in closed form (the presolve reads it ~5,000 times on a
        3-type cluster: the loop over 94 layers took 0.1 s of qwen3-235b-a22b's presolve)."""
        if not self.is_moe:
            return 0
        if self.moe_layer_pattern == "every_k":  # i % k == k - 1 for i < n: n // k of them
            return self.num_layers // self.moe_layer_freq
        if self.moe_layer_pattern == "first_k_dense":
            return max(0, self.num_layers - self.first_k_dense)
        return self.num_layers

    # ---- parameter counts (weights only; biases of norms counted, as HF does)
    @property
    def attention_params(self) -> int:
        if self.is_mla:
            return self.mla_replicated_params + self.mla_split_params
        h, q, kv = self.hidden, self.num_heads * self.dim_head, self.kv_heads * self.dim_head
        bias = (q + 2 * kv) if self.qkv_bias else 0
        return h * q + 2 * h * kv + q * h + bias

    def attention_params_per_rank(self, tp: int) -> float:
        """Attention weights on one of tp ranks: the split matrices / tp, plus (MLA) the replicated
        down-projections whole."""
        return (self.attention_params - self.mla_replicated_params) / tp + self.mla_replicated_params

    @property
    def mla_replicated_params(self) -> int:
        """MLA's down-projections and latent norms, which Megatron-Core keeps whole on every tp rank (its
        ``linear_q_down_proj`` / ``linear_kv_down_proj`` are not split): h x q_lora (+ q_lora norm) and
        h x (kv_lora + rope) (+ kv_lora norm). 0 without MLA."""
        if not self.is_mla:
            return 0
        h, r = self.hidden, self.qk_rope_head_dim
        q_down = (h * self.q_lora_rank + self.q_lora_rank) if self.q_lora_rank else 0
        return q_down + h * (self.kv_lora_rank + r) + self.kv_lora_rank

    @property
    def mla_split_params(self) -> int:
        """MLA's tp-split matrices: the query up-projection (or the full query projection without q_lora),
        the key/value up-projection kv_lora x heads (nope + v), and the output projection heads x v x h."""
        n, qk = self.num_heads, self.dim_head
        q_in = self.q_lora_rank or self.hidden
        return q_in * n * qk + self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim) + \
            n * self.v_head_dim * self.hidden

    @property
    def dense_mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return self.mlp_matrices * self.hidden * self.expert_ffn

    @property
    def shared_expert_params(self) -> int:
        return self.num_shared_experts * self.mlp_matrices * self.hidden * self.shared_ffn

    @property
    def router_params(self) -> int:
        return self.hidden * self.num_experts

    def layer_params(self, i: int, active: bool = False) -> int:
        """Parameters of decoder layer ``i``; ``active`` counts only top_k routed experts."""
        norms = 2 * self.hidden
        if not self.is_moe_layer(i):
            return self.attention_params + self.dense_mlp_params + norms
        experts = self.top_k if active else self.num_experts
        return (
            self.attention_params
            + experts * self.expert_params
            + self.shared_expert_params
            + self.router_params
            + norms
        )

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden

    @property
    def head_params(self) -> int:
        """Final norm + LM head (0 extra matrix when tied)."""
        return self.hidden + (0 if self.tied_embeddings else self.vocab_size * self.hidden)

    @computed_field(description="Total parameters (all experts).")  # type: ignore[prop-decorator]
    @cached_property
    def num_params_total(self) -> int:
        layers = sum(self.layer_params(i) for i in range(self.num_layers))
        return self.embedding_params + layers + self.head_params

    @computed_field(description="Parameters active per token (top_k experts).")  # type: ignore[prop-decorator]
    @cached_property
    def num_params_active(self) -> int:
        layers = sum(self.layer_params(i, active=True) for i in range(self.num_layers))
        return self.embedding_params + layers + self.head_params
