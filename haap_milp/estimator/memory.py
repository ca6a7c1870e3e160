"""Memory per GPU: weights, gradients, optimizer state, activations (bytes).

* Bytes per parameter: Megatron-LM ``docs/user-guide/features/dist_optimizer.md`` table (d = DP size):
  bf16 params + fp32 grads: 18 plain, 6 + 12/d distributed; fp16 params + fp16 grads: 20 plain,
  4 + 16/d distributed (the 12 is ``TrainingSpec.optimizer_state_bytes_per_param``: fp32 master, m, v;
  fp16 adds a 4-byte fp32 gradient copy to the sharded part). fp8 (Transformer Engine) keeps bf16
  weights, so it uses the bf16 row; its transient fp8 weight copies are not counted.
* Activations per layer: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models" (MLSys'23) Table 2, generalised to GQA, SwiGLU and any ffn: a part that tensor parallelism
  leaves replicated (norm inputs, GEMM inputs of the attention and MLP blocks, dropout masks: 10·sbh
  for GPT) and a part it shards (Q, K, V, attention output, MLP intermediates: 24·sbh/t for GPT, plus
  5·a·s²·b/t for the unfused softmax path). Sequence parallelism shards the first part too;
  selective recompute drops the s² part; full recompute keeps only the layer input (2·sbh, /t with
  SP). Flash attention (Megatron-Core/TE default) stores no s² part, only a fp32 log-sum-exp per head.
* Embedding input ``8·s·b`` and output layer + cross-entropy ``4·s·b·h·(1 + V/h)/t``:
  Megatron-LM ``megatron/training/theoretical_memory_usage.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.estimator.kernels import MODERN, Implementation
from haap_milp.specs import ModelSpec

A = 2  # bytes per 16-bit activation element


@dataclass(frozen=True)
class ParamBytes:
    """Bytes per parameter held by one GPU, split by kind."""

    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def bytes_per_param(precision: str, distributed_optimizer: bool, dp: int, optimizer_state_bytes: float) -> ParamBytes:
    """Megatron's table (see module doc); the optimizer part is sharded over ``dp`` with the distributed optimizer."""
    return param_bytes(precision, 1 if distributed_optimizer else 0, dp, optimizer_state_bytes)


def param_bytes(precision: str, zero_stage: int, dp: int, optimizer_state_bytes: float) -> ParamBytes:
    """Bytes per parameter by ZeRO stage (Rajbhandari et al., "ZeRO", SC'20, sec. 5.1-5.3: stage 1 shards the
    optimizer state over the ``dp`` ranks, stage 2 also the gradients, stage 3 also the weights).

    fp32 / tf32 (pure fp32 training, no mixed precision): 4-byte weights and gradients, and no fp32 master copy
    - the weights are the master - so the optimizer keeps ``optimizer_state_bytes - 4`` (Adam: m and v = 8;
    ZeRO paper sec. 3.1: 16 bytes/param in all for fp32 Adam vs 2 + 2 + 12 mixed)."""
    if precision == "fp16":
        weights, grads, opt = 2.0, 2.0, optimizer_state_bytes + 4.0
    elif precision in ("fp32", "tf32"):
        weights, grads, opt = 4.0, 4.0, max(0.0, optimizer_state_bytes - 4.0)
    else:  # bf16 and fp8 (bf16 weights, fp32 main gradients)
        weights, grads, opt = 2.0, 4.0, optimizer_state_bytes
    return ParamBytes(weights / dp if zero_stage >= 3 else weights, grads / dp if zero_stage >= 2 else grads,
                      opt / dp if zero_stage >= 1 else opt)


def _attention_parts(model: ModelSpec, tokens: float, seq: float, impl: Implementation,
                     a: float = A) -> tuple[float, float, float]:
    """(replicated, sharded, score-path) bytes of the attention block + its norm, for ``tokens`` tokens."""
    h = model.hidden
    q, kv = model.num_heads * model.dim_head, model.kv_heads * model.dim_head
    replicated = tokens * (a * h * 2 + (h if impl.dropout else 0))  # norm in, norm out (= QKV in), mask
    sharded = tokens * a * (q + 2 * kv) + tokens * a * q  # Q, K, V for QK^T / AV; attention out (proj in)
    if impl.flash_attention:
        scores = tokens * model.num_heads * 4.0  # fp32 log-sum-exp per head
    else:  # softmax out (2) + dropout mask (1) + dropout out (2) per score (Korthikanti: 5·a·s²·b)
        scores = tokens * model.num_heads * seq * (2 * a + 1 if impl.dropout else a)
    return replicated, sharded, scores


def _mlp_parts(model: ModelSpec, tokens: float, ffn: float, impl: Implementation, a: float = A) -> tuple[float, float]:
    """(replicated, sharded) bytes of a dense MLP block + its norm: norm in, fc1 in, fc1 out, act out."""
    h = model.hidden
    up = 2 if model.activation == "swiglu" else 1
    replicated = tokens * (a * h * 2 + (h if impl.dropout else 0))
    sharded = tokens * a * (up * ffn + ffn)
    return replicated, sharded


def _expert_bytes(model: ModelSpec, tokens: float, tp: int, etp: int, a: float = A) -> float:
    """Routed-expert activations per GPU (balanced routing): each GPU processes tokens·top_k·etp/tp
    token-expert pairs of ffn/etp width: permuted input, fc1 out, act out, expert output (for the
    combine backward); plus fp32 router logits of its tokens."""
    up = 2 if model.activation == "swiglu" else 1
    pairs = tokens * model.top_k * etp / tp
    f = model.expert_ffn / etp
    return pairs * a * (2 * model.hidden + up * f + f) + tokens / tp * model.num_experts * 4.0


def layer_activation_bytes(
    model: ModelSpec, moe: bool, micro_batch: float, seq: int, tp: int, sp: bool, recompute: str,
    cp: int = 1, etp: int = 1, impl: Implementation = MODERN, a: float = A,
) -> float:
    """Bytes one GPU keeps for one decoder layer and one in-flight micro-batch (see module doc); ``a``: bytes
    per activation element (2; 4 in fp32 / tf32 training)."""
    tokens = micro_batch * seq / cp
    rep_div = tp if (sp and tp > 1) else 1
    if recompute == "full":
        return a * model.hidden * tokens / rep_div
    rep_a, sh_a, scores = _attention_parts(model, tokens, seq, impl, a)
    if recompute == "selective" and not impl.flash_attention:
        scores = 0.0
    if not moe:
        rep_m, sh_m = _mlp_parts(model, tokens, model.ffn_hidden, impl, a)
        return (rep_a + rep_m) / rep_div + (sh_a + sh_m + scores) / tp
    rep_m = tokens * a * model.hidden * 2  # norm in + router/expert input (norm out)
    shared = 0.0
    if model.num_shared_experts:
        shared = _mlp_parts(model, tokens, model.shared_ffn * model.num_shared_experts, impl, a)[1] / tp
    return (rep_a + rep_m) / rep_div + (sh_a + scores) / tp + shared + _expert_bytes(model, tokens, tp, etp, a)


def embedding_activation_bytes(micro_batch: float, seq: int, cp: int = 1) -> float:
    """Token ids (int64) of one micro-batch (Megatron: 8·s·b)."""
    return 8.0 * micro_batch * seq / cp


def head_activation_bytes(model: ModelSpec, micro_batch: float, seq: int, tp: int, cp: int = 1,
                          impl: Implementation = MODERN) -> float:
    """Output layer + cross-entropy: 4·s·b·h/t + logit_bytes·s·b·V/t (Megatron: logit_bytes = 4, i.e.
    4·s·b·h·(1 + V/h)/t with fp32 vocab-parallel logits)."""
    tokens = micro_batch * seq / cp
    return (4.0 * tokens * model.hidden + impl.logit_bytes * tokens * model.vocab_size) / tp


def recompute_working_bytes(model: ModelSpec, moe: bool, micro_batch: float, seq: int, tp: int, sp: bool,
                            recompute: str, cp: int = 1, etp: int = 1, impl: Implementation = MODERN,
                            a: float = A) -> float:
    """Transient peak of recomputation: during the backward of a fully recomputed layer its complete
    activations exist again for one micro-batch (selective recompute: only the s² score path, which flash
    attention never stores). Charged once per stage."""
    if recompute != "full":
        return 0.0
    return layer_activation_bytes(model, moe, micro_batch, seq, tp, sp, "none", cp, etp, impl, a)


# ------------------------------------------------------------------ parameters per GPU


def dense_layer_params_per_gpu(model: ModelSpec, tp: int) -> float:
    return (model.attention_params + model.dense_mlp_params) / tp + 2 * model.hidden


def moe_layer_params_per_gpu(model: ModelSpec, tp: int, ep: int, etp: int) -> tuple[float, float]:
    """(non-expert, expert) parameters on one GPU: attention, router and shared experts split over tp
    (router replicated), routed experts over ep x etp."""
    non_expert = (model.attention_params + model.shared_expert_params) / tp + model.router_params + 2 * model.hidden
    expert = model.num_experts * model.expert_params / (ep * etp)
    return non_expert, expert
