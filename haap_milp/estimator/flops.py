"""FLOP counts per layer kind, and the closed forms published runs use.

Convention: one multiply-add = 2 FLOPs; backward = 2 x forward (one GEMM for the input gradient,
one for the weight gradient: Narayanan et al. SC'21 sec. 5.1). *Model* FLOPs count forward +
backward once (3 passes); *hardware* FLOPs add what recomputation repeats (full: the whole forward;
selective: the core attention, Korthikanti et al. MLSys'23 sec. 4.1). Causal attention computes
half of the score matrix (flash attention skips masked blocks), so haap's own model FLOPs count
half; sources that count the full square (SC'21, NeMo) are reproduced by ``causal=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.specs import ModelSpec


@dataclass(frozen=True)
class Gemm:
    """One GEMM per rank: C[m, n] = A[m, k] @ B[k, n], repeated ``count`` times (e.g. grouped experts)."""

    m: float
    n: float
    k: float
    count: float = 1.0

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def attention_gemms(model: ModelSpec, tokens: float, tp: int) -> list[Gemm]:
    """QKV and output projections of one rank (Megatron column/row-parallel split over tp); MLA: ``mla_gemms``."""
    if model.is_mla:
        return mla_gemms(model, tokens, tp)
    q, kv = model.num_heads * model.dim_head, model.kv_heads * model.dim_head
    return [Gemm(tokens, (q + 2 * kv) / tp, model.hidden), Gemm(tokens, model.hidden, q / tp)]


def mla_gemms(model: ModelSpec, tokens: float, tp: int) -> list[Gemm]:
    """Multi-head latent attention (DeepSeek-V2 sec. 2.1; Megatron-Core ``MLASelfAttention``) on one rank: the
    down-projections h -> q_lora and h -> kv_lora + rope run whole on every tp rank (not split), the
    up-projections q_lora -> heads x (nope + rope) and kv_lora -> heads x (nope + v) and the output projection
    heads x v -> h are split over tp. Without q_lora the query is one h -> heads x (nope + rope) projection."""
    n, qk, v, h = model.num_heads, model.dim_head, model.v_head_dim, model.hidden
    out = []
    if model.q_lora_rank:
        out += [Gemm(tokens, model.q_lora_rank, h), Gemm(tokens, n * qk / tp, model.q_lora_rank)]
    else:
        out.append(Gemm(tokens, n * qk / tp, h))
    out += [Gemm(tokens, model.kv_lora_rank + model.qk_rope_head_dim, h),
            Gemm(tokens, n * (model.qk_nope_head_dim + v) / tp, model.kv_lora_rank),
            Gemm(tokens, h, n * v / tp)]
    return out


def mlp_gemms(model: ModelSpec, tokens: float, ffn: int, tp: int, count: float = 1.0) -> list[Gemm]:
    """Up(+gate) and down projections of one MLP of inner size ``ffn`` split over tp."""
    up = (2 if model.activation == "swiglu" else 1) * ffn / tp
    return [Gemm(tokens, up, model.hidden, count), Gemm(tokens, model.hidden, ffn / tp, count)]


def op_sac_matmuls(model: ModelSpec, tp: int) -> list[tuple[float, float]]:
    """(input width, output width per GPU) of a decoder block's matmuls in forward order, as torchtitan's Llama-style
    blocks run them (torchtitan models/llama3: ``wq, wk, wv`` then ``wo``; FeedForward ``w2(silu(w1(x)) * w3(x))``:
    w1, w3, w2; a 2-matrix MLP w1, w2). Column-parallel outputs are split over tp; the row-parallel ``wo`` / ``w2``
    produce a full-width partial sum."""
    h, q, kv = model.hidden, model.num_heads * model.dim_head, model.kv_heads * model.dim_head
    f = model.ffn_hidden
    mlp = [(h, f / tp), (h, f / tp), (f / tp, h)] if model.activation == "swiglu" else [(h, f / tp), (f / tp, h)]
    return [(h, q / tp), (h, kv / tp), (h, kv / tp), (q / tp, h), *mlp]


def op_sac_recomputed_matmuls(model: ModelSpec, tokens: float, tp: int, moe: bool) -> list[tuple[float, float, float]]:
    """(m, n, k) of the matmuls op-level SAC runs again in the backward (the even-numbered ones)."""
    mms = op_sac_matmuls(model, tp)[: 4 if moe else None]
    return [(tokens, out, k) for i, (k, out) in enumerate(mms) if i % 2 == 1]


def attention_core_fwd_flops(model: ModelSpec, tokens: float, seq: float, causal: bool = True) -> float:
    """QK^T and AV of ``tokens`` queries against ``seq`` keys: 2·tokens·seq·(q_dim + attention-out dim), i.e.
    2 x 2·tokens·seq·q_dim (SC'21 eq. 1) when the value and query head dims agree (MLA: 192 vs 128)."""
    full = 2.0 * tokens * seq * (model.q_width + model.attn_out_width)
    return full * (0.5 if causal else 1.0)


def routed_tokens(model: ModelSpec, tokens: float) -> float:
    """Token-expert pairs of a MoE layer (balanced routing, dropless)."""
    return tokens * model.top_k


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one layer for a micro-batch (whole layer, all ranks)."""

    gemm_fwd: float  # dense projections, router, experts, LM head
    attn_fwd: float  # core attention (scores and AV)

    @property
    def model(self) -> float:
        return 3.0 * (self.gemm_fwd + self.attn_fwd)

    op_fwd: float = 0.0  # matmuls torchtitan's op-level SAC repeats (recompute "op")

    def hardware(self, recompute: str) -> float:
        extra = {"none": 0.0, "selective": self.attn_fwd, "full": self.gemm_fwd + self.attn_fwd,
                 "op": self.op_fwd}[recompute]
        return self.model + extra


def dense_layer_flops(model: ModelSpec, tokens: float, seq: float, causal: bool = True) -> LayerFlops:
    gemms = attention_gemms(model, tokens, 1) + mlp_gemms(model, tokens, model.ffn_hidden, 1)
    return LayerFlops(sum(g.flops for g in gemms), attention_core_fwd_flops(model, tokens, seq, causal),
                      _op_flops(model, tokens, False))


def _op_flops(model: ModelSpec, tokens: float, moe: bool) -> float:
    return sum(2.0 * m * n * k for m, n, k in op_sac_recomputed_matmuls(model, tokens, 1, moe))


def moe_layer_flops(model: ModelSpec, tokens: float, seq: float, causal: bool = True) -> LayerFlops:
    """Attention + router (h x E) + top_k routed experts + shared experts."""
    gemms = attention_gemms(model, tokens, 1)
    gemms.append(Gemm(tokens, model.num_experts, model.hidden))
    gemms += mlp_gemms(model, routed_tokens(model, tokens), model.expert_ffn, 1)
    if model.num_shared_experts:
        gemms += mlp_gemms(model, tokens, model.shared_ffn, 1, count=model.num_shared_experts)
    return LayerFlops(sum(g.flops for g in gemms), attention_core_fwd_flops(model, tokens, seq, causal),
                      _op_flops(model, tokens, True))


def head_flops(model: ModelSpec, tokens: float) -> LayerFlops:
    """LM head logits (h x V); the embedding lookup has no FLOPs."""
    return LayerFlops(2.0 * tokens * model.hidden * model.vocab_size, 0.0)


def mean_layer_flops(model: ModelSpec, tokens: float, seq: float, causal: bool = True) -> LayerFlops:
    """Mean over the decoder layers (dense and MoE layers mixed by the model's pattern)."""
    n_moe = model.num_moe_layers
    frac = n_moe / model.num_layers
    d = dense_layer_flops(model, tokens, seq, causal)
    if not n_moe:
        return d
    m = moe_layer_flops(model, tokens, seq, causal)
    return LayerFlops((1 - frac) * d.gemm_fwd + frac * m.gemm_fwd, (1 - frac) * d.attn_fwd + frac * m.attn_fwd,
                      (1 - frac) * d.op_fwd + frac * m.op_fwd)


def model_flops_per_sample(model: ModelSpec, seq: int, causal: bool = True) -> float:
    """Model FLOPs (fwd + bwd) of one sequence through the whole model."""
    layer = mean_layer_flops(model, seq, seq, causal)
    return model.num_layers * layer.model + head_flops(model, seq).model


# ---------------------------------------------------------------- closed forms used by sources


def narayanan_sc21_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """SC'21 eq. (3): 96·B·s·l·h²·(1 + s/6h + V/16lh), full recompute included (4 passes)."""
    return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def megatron_model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """The same without recompute (3 passes): 72·B·s·l·h²·(1 + s/6h + V/12lh)."""
    return 72.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


def six_n_flops(params: float, tokens: float) -> float:
    """Kaplan et al. 2020: training FLOPs ~ 6·N·D."""
    return 6.0 * params * tokens
