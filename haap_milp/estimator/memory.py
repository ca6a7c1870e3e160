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
* Recompute ``op`` (torchtitan's op-level selective checkpointing): what its policy saves, per block
  (``op_sac_layer_bytes``); PyTorch DTensor TP keeps the all-gathered inputs of column-parallel linears
  (``Implementation.tp_saves_gathered_input``).
* Embedding input ``8·s·b`` and output layer + cross-entropy ``4·s·b·h·(1 + V/h)/t``:
  Megatron-LM ``megatron/training/theoretical_memory_usage.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.estimator.flops import op_sac_matmuls
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


def param_bytes(precision: str, zero_stage: int, dp: int, optimizer_state_bytes: float,
                grad_element_bytes: float | None = None) -> ParamBytes:
    """Bytes per parameter by ZeRO stage (Rajbhandari et al., "ZeRO", SC'20, sec. 5.1-5.3: stage 1 shards the
    optimizer state over the ``dp`` ranks, stage 2 also the gradients, stage 3 also the weights).

    fp32 / tf32 (pure fp32 training, no mixed precision): 4-byte weights and gradients, and no fp32 master copy
    - the weights are the master - so the optimizer keeps ``optimizer_state_bytes - 4`` (Adam: m and v = 8;
    ZeRO paper sec. 3.1: 16 bytes/param in all for fp32 Adam vs 2 + 2 + 12 mixed)."""
    if precision == "fp16":
        weights, grads, opt = 2.0, 2.0, optimizer_state_bytes + 4.0
    elif precision in ("fp32", "tf32"):
        weights, grads, opt = 4.0, 4.0, max(0.0, optimizer_state_bytes - 4.0)
    else:  # bf16 and fp8 (bf16 weights, fp32 main gradients; ``grad_element_bytes`` 2: a bf16 grad buffer, whose
        # fp32 copy of the optimizer's shard exists only during the step, when the activations are freed)
        weights, grads, opt = 2.0, grad_element_bytes or 4.0, optimizer_state_bytes
    return ParamBytes(weights / dp if zero_stage >= 3 else weights, grads / dp if zero_stage >= 2 else grads,
                      opt / dp if zero_stage >= 1 else opt)


def _attention_parts(model: ModelSpec, tokens: float, seq: float, impl: Implementation,
                     a: float = A, g: float = A) -> tuple[float, float, float]:
    """(replicated, sharded, score-path) bytes of the attention block + its norm, for ``tokens`` tokens;
    ``g``: bytes per element of a saved GEMM input (``gemm_input_bytes``)."""
    h = model.hidden
    replicated = tokens * (a * h + g * h + (h if impl.dropout else 0))  # norm in, norm out (= QKV in), mask
    # Q, K, V for QK^T / AV (MLA: the up-projected ones); attention out (proj in)
    sharded = tokens * a * (model.q_width + model.k_width + model.v_width) + tokens * g * model.attn_out_width
    if impl.flash_attention:
        scores = tokens * model.num_heads * 4.0  # fp32 log-sum-exp per head
    else:  # softmax out (2) + dropout mask (1) + dropout out (2) per score (Korthikanti: 5·a·s²·b)
        scores = tokens * model.num_heads * seq * (2 * a + 1 if impl.dropout else a)
    return replicated, sharded, scores


def mla_latent_bytes(model: ModelSpec, tokens: float, a: float = A, g: float = A) -> float:
    """MLA's compressed activations of ``tokens`` tokens, kept whole on every tp rank: the query latent (its norm's
    input, and its output = the query up-projection's input) and the key/value latent + shared RoPE key (likewise).
    0 without MLA."""
    if not model.is_mla:
        return 0.0
    return tokens * (a + g) * ((model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim)


def _mlp_parts(model: ModelSpec, tokens: float, ffn: float, impl: Implementation, a: float = A,
               g: float = A) -> tuple[float, float]:
    """(replicated, sharded) bytes of a dense MLP block + its norm: norm in, fc1 in, fc1 out, act out (fc1 in
    and act out are GEMM inputs: ``g`` bytes)."""
    h = model.hidden
    up = 2 if model.activation == "swiglu" else 1
    replicated = tokens * (a * h + g * h + (h if impl.dropout else 0))
    sharded = tokens * (a * up * ffn + g * ffn)
    return replicated, sharded


def _expert_parts(model: ModelSpec, tokens: float, tp: int, etp: int, impl: Implementation,
                  a: float = A, g: float = A) -> tuple[float, float]:
    """(kept by the experts, of which the activation output) bytes of the routed experts on one GPU (balanced
    routing): each GPU processes tokens·top_k·etp/tp token-expert pairs of ffn/etp width and keeps the
    permuted input (fc1's input), fc1 out, act out (fc2's input) and the expert output (for the combine's
    backward); plus fp32 router logits of its tokens. Megatron-Core's dispatchers all keep these (the
    permutation is an index gather whose backward needs no input); their transient buffers are
    ``dispatcher_buffer_bytes``."""
    up = 2 if model.activation == "swiglu" else 1
    pairs = tokens * model.top_k * etp / tp
    f = model.expert_ffn / etp
    act_out = pairs * g * f  # fc2's input
    kept = pairs * (g * model.hidden + a * model.hidden + a * up * f)  # fc1 in, expert out, fc1 out
    return kept + act_out + tokens / tp * model.num_experts * 4.0, act_out


def gemm_input_bytes(precision: str) -> float:
    """Bytes per element of an activation kept as the input of a GEMM for its weight gradient: Transformer
    Engine's fp8 recipes save the quantized input (1 byte; TE Linear / LayerNormLinear keep the fp8 copy they
    computed with, not the bf16 one), fp32 / tf32 training 4, else 2."""
    return 1.0 if precision == "fp8" else 4.0 if precision in ("fp32", "tf32") else float(A)


def layer_activation_bytes(
    model: ModelSpec, moe: bool, micro_batch: float, seq: int, tp: int, sp: bool, recompute: str,
    cp: int = 1, etp: int = 1, impl: Implementation = MODERN, a: float = A, g: float | None = None,
) -> float:
    """Bytes one GPU keeps for one decoder layer and one in-flight micro-batch (see module doc); ``a``: bytes
    per activation element (2; 4 in fp32 / tf32 training); ``g``: per saved GEMM-input element (None: ``a``;
    ``gemm_input_bytes``). ``recompute="selective"`` drops what
    ``impl.recompute_modules`` recomputes (Megatron-Core semantics: a checkpointed module keeps only its
    input, which its caller keeps anyway): core_attn the s² score path (flash attention stores none);
    layernorm the two norm outputs (QKV input, MLP/router input); mlp a dense MLP's inner activations;
    moe the whole routed-expert part and the shared experts; moe_act the experts' activation output;
    shared_experts the shared experts' inner activations; mla_up_proj MLA's up-projected Q, K, V."""
    tokens = micro_batch * seq / cp
    g = a if g is None else g
    rep_div = tp if (sp and tp > 1) else 1
    if recompute == "full":
        return a * model.hidden * tokens / rep_div
    if recompute == "op":
        return op_sac_layer_bytes(model, moe, tokens, tp, sp, etp, impl, a, g)
    sel = recompute == "selective"
    drop_norm = sel and impl.recomputes("layernorm")
    norm_out = tokens * g * model.hidden if drop_norm else 0.0  # a norm output that feeds a GEMM
    rep_a, sh_a, scores = _attention_parts(model, tokens, seq, impl, a, g)
    rep_a -= norm_out
    full = mla_latent_bytes(model, tokens, a, g)  # whole on every tp rank (MLA's down-projections are not split)
    if model.is_mla and sel and impl.recomputes("mla_up_proj"):  # the up-projections' outputs Q, K, V recomputed
        sh_a -= tokens * a * (model.q_width + model.k_width + model.v_width)
    if sel and impl.recomputes("core_attn") and not impl.flash_attention:
        scores = 0.0
    # DTensor TP keeps the gathered GEMM input (the norm output) whole: move it from the sequence-sharded part
    gathered = tokens * g * model.hidden - norm_out if impl.tp_saves_gathered_input and rep_div > 1 else 0.0
    if not moe:
        rep_m, sh_m = _mlp_parts(model, tokens, model.ffn_hidden, impl, a, g)
        if sel and impl.recomputes("mlp"):
            sh_m = 0.0
        return (rep_a + rep_m - norm_out - 2 * gathered) / rep_div + 2 * gathered + (sh_a + sh_m + scores) / tp + full
    # norm in + router/dispatcher input (norm out, 16-bit: the router and the dispatch are not fp8)
    rep_m = tokens * a * model.hidden * (1 if drop_norm else 2)
    shared = 0.0
    whole_moe = sel and impl.recomputes("moe")
    if model.num_shared_experts and not (whole_moe or (sel and impl.recomputes("shared_experts"))):
        shared = _mlp_parts(model, tokens, model.shared_ffn * model.num_shared_experts, impl, a, g)[1] / tp
    experts, act_out = _expert_parts(model, tokens, tp, etp, impl, a, g)
    if whole_moe:
        experts = 0.0
    elif sel and impl.recomputes("moe_act"):
        experts -= act_out
    return (rep_a - gathered) / rep_div + gathered + rep_m / rep_div + (sh_a + scores) / tp + full + shared + experts


def op_sac_layer_bytes(model: ModelSpec, moe: bool, tokens: float, tp: int, sp: bool, etp: int = 1,
                       impl: Implementation = MODERN, a: float = A, g: float = A) -> float:
    """Bytes one GPU keeps per decoder layer and micro-batch under torchtitan's op-level selective activation
    checkpointing (recompute mode ``op``; torchtitan ``activation_checkpoint.mode = "selective"``,
    ``selective_ac_option = "op"``, its 0.3 ``SelectiveAC``). The policy (torchtitan parallelisms/
    parallelize_llama.py ``_save_list`` / ``_custom_policy``, Dec 2024; distributed/activation_checkpoint.py
    ``SelectiveAC`` in 0.3.0) saves the outputs of compute-intensive ops - every odd-numbered ``aten.mm`` of the
    block (a fresh counter per checkpointed call: mm 1, 3, 5, 7 = wq, wv, w1, w2 of a Llama block), the SDPA
    outputs (attention output + fp32 log-sum-exp per head), the TP reduce-scatter outputs - and recomputes
    everything else (every even mm, norms, RoPE, activations); the checkpoint keeps the block input.
    Outputs are 16-bit (``a``): torchao Float8 linears return bf16 and mm counts the same.
    MoE layers: the effect on the routed experts is not modelled; they keep what they keep without recompute
    (an upper bound), the attention part follows the rule above."""
    h, q = model.hidden, model.num_heads * model.dim_head
    rep_div = tp if (sp and tp > 1) else 1
    kept = tokens * a * h / rep_div  # the checkpointed block's input
    kept += tokens * (a * q / tp + model.num_heads / tp * 4.0)  # SDPA output + log-sum-exp
    if tp > 1 and sp:
        kept += 2 * tokens * a * h / tp  # reduce-scatter outputs of wo and w2 (sequence parallel)
    mms = op_sac_matmuls(model, tp)
    if moe:
        mms = mms[:4]
        experts = _expert_parts(model, tokens, tp, etp, impl, a, g)[0]
        shared = (_mlp_parts(model, tokens, model.shared_ffn * model.num_shared_experts, impl, a, g)[1] / tp
                  if model.num_shared_experts else 0.0)
        kept += experts + shared  # the norm and router input are recomputed (a norm, a force-recomputed gate mm)
    kept += sum(tokens * a * out for i, (_, out) in enumerate(mms) if i % 2 == 0)  # mm 1, 3, 5, 7 (1-based)
    return kept


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
                            a: float = A, g: float | None = None) -> float:
    """Transient peak of recomputation: during the backward of a recomputed layer what it dropped exists
    again for one micro-batch (full: the complete activations; selective: what its modules dropped, e.g.
    the s² score path or a MoE layer's expert activations). Charged once per stage."""
    if recompute == "none":
        return 0.0
    args = (model, moe, micro_batch, seq, tp, sp)
    full = layer_activation_bytes(*args, "none", cp, etp, impl, a, g)
    if recompute == "full":
        return full
    return full - layer_activation_bytes(*args, recompute, cp, etp, impl, a, g)


def dispatcher_buffer_bytes(model: ModelSpec, micro_batch: float, seq: int, tp: int, ep: int, cp: int = 1,
                            impl: Implementation = MODERN, a: float = A) -> float:
    """Transient MoE dispatch buffers of one micro-batch on one GPU, by ``impl.moe_dispatcher`` (Megatron-Core
    token_dispatcher.py): alltoall and flex keep a second copy of this GPU's routed tokens while they are sent
    (the permuted send buffer beside the received one; DeepEP's preallocated NVLink/RDMA buffers are part of the
    fixed overhead); allgather gathers the hidden states of the whole tp x ep group before the local
    permutation (tokens·ep rows of h). Charged once per stage (one MoE layer dispatches at a time)."""
    if not model.is_moe:
        return 0.0
    tokens = micro_batch * seq / cp
    if impl.moe_dispatcher == "allgather":
        return tokens * ep * model.hidden * a
    return tokens / tp * model.top_k * model.hidden * a


def largest_allocation_bytes(model: ModelSpec, micro_batch: float, seq: int, tp: int, cp: int = 1, etp: int = 1,
                             impl: Implementation = MODERN, a: float = A, head: bool = False) -> float:
    """The largest single tensor of one micro-batch on one GPU: a dense MLP's fc1 output (tokens x up·ffn/tp),
    a MoE layer's expert fc1 output (tokens·top_k·etp/tp x up·ffn/etp), and with ``head`` the loss's fp32
    logits (tokens x V/tp x 4 bytes)."""
    tokens = micro_batch * seq / cp
    up = 2 if model.activation == "swiglu" else 1
    big = tokens * up * model.ffn_hidden / tp * a if model.num_moe_layers < model.num_layers else 0.0
    if model.is_moe:
        big = max(big, tokens * model.top_k * etp / tp * up * model.expert_ffn / etp * a)
    if head:
        big = max(big, tokens * model.vocab_size / tp * 4.0)
    return big


def fragmentation_bytes(largest_bytes: float, fraction: float) -> float:
    """Caching-allocator fragmentation: memory reserved but not allocated at the peak, taken as a fitted share
    (``GlobalParams.frag_fraction``) of the largest allocation - a freed large block split for smaller tensors
    cannot serve the next large request, so the allocator maps a new segment of about that size (PyTorch CUDA
    caching allocator notes; fitted on torchtitan's published peaks, benchmarks/calibrate.py)."""
    return fraction * largest_bytes


# ------------------------------------------------------------------ parameters per GPU


def dense_layer_params_per_gpu(model: ModelSpec, tp: int) -> float:
    return model.attention_params_per_rank(tp) + model.dense_mlp_params / tp + 2 * model.hidden


def moe_layer_params_per_gpu(model: ModelSpec, tp: int, ep: int, etp: int) -> tuple[float, float]:
    """(non-expert, expert) parameters on one GPU: attention, router and shared experts split over tp
    (router replicated), routed experts over ep x etp."""
    non_expert = (model.attention_params_per_rank(tp) + model.shared_expert_params / tp + model.router_params
                  + 2 * model.hidden)
    expert = model.num_experts * model.expert_params / (ep * etp)
    return non_expert, expert
