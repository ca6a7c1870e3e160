"""Per-layer-kind costs on one GPU of a stage (decoder layer dense/MoE, embedding, head), cached.

Times per micro-batch and rank: forward, backward (= input- and weight-gradient GEMMs, flash
attention backward, memory-bound work), recomputation (full: the forward again; selective: the core
attention again, Korthikanti et al. sec. 4.1), TP collectives (2 all-reduce equivalents per dense
layer and pass; with SP the same bytes as all-gather + reduce-scatter: Korthikanti sec. 4.2.2), EP
all-to-all (dispatch + combine per pass), context-parallel KV ring (overlapped with attention).
"""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.estimator import comm, compute
from haap_milp.estimator.calibration import Calibration
from haap_milp.estimator.flops import (
    Gemm,
    attention_core_fwd_flops,
    attention_gemms,
    mla_gemms,
    mlp_gemms,
    op_sac_recomputed_matmuls,
)
from haap_milp.estimator.hardware import Hardware
from haap_milp.estimator.kernels import MODERN, Implementation
from haap_milp.specs import ModelSpec

A = compute.ACT_BYTES


@dataclass(frozen=True)
class Passes:
    """Times of one layer kind for one micro-batch on one rank (raw: before any overlap)."""

    fwd_s: float  # compute of the forward pass
    bwd_s: float  # compute of the backward pass
    attn_fwd_s: float  # core attention forward (what selective recompute repeats)
    tp_fwd_s: float  # TP collectives of one forward pass (backward: the same)
    ep_fwd_s: float  # EP all-to-all (+ expert-TP gathers) of one forward pass (backward: the same)
    cp_fwd_s: float  # exposed context-parallel KV exchange, forward
    cp_bwd_s: float  # exposed context-parallel exchange, backward
    selective_fwd_s: float | None = None  # what selective recompute repeats (None: the core attention)
    selective_ep: float = 0.0  # EP exchanges selective recompute repeats (1: the whole MoE layer is recomputed)
    op_fwd_s: float = 0.0  # what torchtitan's op-level SAC (recompute "op") repeats: even mms + elementwise ops

    def compute_s(self, recompute: str) -> float:
        sel = self.attn_fwd_s if self.selective_fwd_s is None else self.selective_fwd_s
        extra = {"none": 0.0, "selective": sel, "full": self.fwd_s, "op": self.op_fwd_s}[recompute]
        return self.fwd_s + self.bwd_s + extra

    def passes(self, recompute: str) -> float:
        """How many times the forward communication runs: fwd + bwd (+ recomputed fwd). Op-level SAC saves the
        TP reduce-scatter outputs but not the all-gathers, so it repeats half of SP's pair (2.5)."""
        return {"full": 3.0, "op": 2.5}.get(recompute, 2.0)

    def ep_passes(self, recompute: str) -> float:
        """How many times the EP exchange runs (a recomputed MoE layer dispatches and combines again; op-level SAC
        saves all-to-all outputs, torchtitan 0.3 ``_get_default_save_ops``)."""
        if recompute == "op":
            return 2.0
        return self.passes(recompute) + (self.selective_ep if recompute == "selective" else 0.0)


def _gemms_time(gemms: list[Gemm], hw: Hardware, precision: str) -> tuple[float, float]:
    return compute.gemms_fwd_bwd_s(gemms, hw.gpu, hw.params, precision)


def _cast_bytes(gemms: list[Gemm], precision: str) -> float:
    """fp8 (Transformer Engine) quantises each GEMM's activation input (read 2 B, write 1 B per element)."""
    return sum(3.0 * g.m * g.k * g.count for g in gemms) if precision == "fp8" else 0.0


def _attention_block(model: ModelSpec, hw: Hardware, precision: str, tokens: float, seq: int, tp: int, sp: bool,
                     cp: int, impl: Implementation) -> tuple[float, float, float, float, float, float]:
    """(fwd, bwd, attn_fwd, tp_fwd, cp_fwd, cp_bwd) of attention + its norm and residual."""
    h, A = model.hidden, compute.act_bytes(precision)
    gemms = attention_gemms(model, tokens, tp)
    g_f, g_b = _gemms_time(gemms, hw, precision)
    if impl.flash_attention:
        a_f, a_b = compute.attention_fwd_bwd_s(attention_core_fwd_flops(model, tokens, seq) / tp, hw.gpu, hw.params,
                                               precision)
    else:
        a_f, a_b = compute.attention_unfused_fwd_bwd_s(tokens, seq, model.num_heads / tp, model.dim_head, hw.gpu,
                                                       hw.params, precision, impl.dropout)
    rep = tokens / tp if sp else tokens
    # norm (read h, write h) + residual add (read 2h, write h) on the replicated tokens; RoPE on Q and K
    traffic = A * rep * 5 * h + A * tokens * _rope_and_latent_width(model, tp) + _cast_bytes(gemms, precision)
    kernels = 3 + (3 if model.is_mla else 0)  # MLA: the two latent norms and the K = [k_nope, k_rope] concat
    e_f = compute.memory_bound_s(traffic, kernels, hw.gpu, hw.params)
    e_b = compute.memory_bound_s(2 * traffic, 2 * kernels, hw.gpu, hw.params)
    tp_f = _tp_collective(hw, tp, tokens * h * A)
    cp_f, cp_b = _cp_exchange(hw, tokens, (model.k_width + model.v_width) / 2, tp, cp, a_f, a_b, A)
    return g_f + a_f + e_f, g_b + a_b + e_b, a_f, tp_f, cp_f, cp_b


def _rope_and_latent_width(model: ModelSpec, tp: int) -> float:
    """Elements read + written per token by RoPE and (MLA) the latent-path elementwise work, on one rank.
    Without MLA: RoPE on Q and K (read + write each). MLA (DeepSeek-V2 sec. 2.1; Megatron-Core MLASelfAttention):
    RoPE on the queries' rope part and the one shared rope key, the RMSNorms of the q and kv latents (whole on
    every rank), and assembling K = [k_nope, k_rope broadcast over the heads] (write the rank's K once)."""
    if not model.is_mla:
        return 2 * (model.q_width + model.k_width) / tp
    n, r = model.num_heads, model.qk_rope_head_dim
    latents = (model.q_lora_rank or 0) + model.kv_lora_rank
    return 2 * (n * r / tp + r) + 2 * latents + (model.k_width / tp + n * model.qk_nope_head_dim / tp)


def _tp_collective(hw: Hardware, tp: int, message_bytes: float) -> float:
    """One all-reduce (no SP) or all-gather + reduce-scatter (SP): same bytes, inside a node, on the link
    ``Hardware.tp_ring_step`` gives (a measured p2p stream read at the ring's step size)."""
    link, _ = hw.tp_ring_step(message_bytes, tp)
    return comm.ring("all_reduce", tp, link).time(message_bytes)


def _cp_exchange(hw: Hardware, tokens: float, kv: float, tp: int, cp: int, a_f: float, a_b: float,
                 A: float = A) -> tuple[float, float]:
    """Ring attention (Megatron CP, eq. CP2): cp-1 steps passing this rank's K and V block (bwd: K, V and dK,
    dV, twice the bytes), each overlapped with the attention compute of one block (comm.ring_attention_exposed).
    CP ranks are tp apart in Megatron's order (tp-cp-ep-dp-pp), so the ring stays on NVLink while tp*cp fits a
    node and crosses the NIC (each GPU's share of it) otherwise. ``tokens`` = this rank's b*seq/cp."""
    if cp <= 1:
        return 0.0, 0.0
    step_bytes = 2 * tokens * kv / tp * A  # kv = the mean of the K and V widths (MLA: up-projected, per head)
    link = hw.intra(step_bytes, cp, "p2p") if tp * cp <= hw.gpus_per_node else hw.nic_gpu_at(step_bytes)
    step = comm.p2p(link).time(step_bytes)
    return comm.ring_attention_exposed(cp, step, a_f), comm.ring_attention_exposed(cp, 2 * step, a_b)


def _mlp_block(model: ModelSpec, hw: Hardware, precision: str, tokens: float, tp: int, sp: bool,
               ffn: int, count: float = 1.0, norm: bool = True) -> tuple[float, float, float]:
    """(fwd, bwd, tp_fwd) of a tp-sharded dense MLP (+ its norm and residual when ``norm``)."""
    h, A = model.hidden, compute.act_bytes(precision)
    gemms = mlp_gemms(model, tokens, ffn, tp, count)
    g_f, g_b = _gemms_time(gemms, hw, precision)
    rep = tokens / tp if sp else tokens
    act = (3 if model.activation == "swiglu" else 2) * ffn * count / tp
    traffic = A * rep * 5 * h * norm + A * tokens * act + _cast_bytes(gemms, precision)
    e_f = compute.memory_bound_s(traffic, 3, hw.gpu, hw.params)
    e_b = compute.memory_bound_s(2 * traffic, 6, hw.gpu, hw.params)
    return g_f + e_f, g_b + e_b, _tp_collective(hw, tp, tokens * h * A)


def _moe_block(model: ModelSpec, hw: Hardware, precision: str, tokens: float, tp: int, sp: bool, ep: int,
               etp: int, impl: Implementation = MODERN) -> tuple[float, float, float, float]:
    """(fwd, bwd, tp_fwd, ep_fwd): router, routed experts (grouped GEMM, balanced routing), shared experts.

    Tokens reach the dispatcher sequence-sharded (tokens/tp per GPU, Megatron-Core MoE with SP); each GPU
    computes tokens·top_k·etp/tp token-expert pairs over its E/ep local experts at width ffn/etp."""
    h, E, A = model.hidden, model.num_experts, compute.act_bytes(precision)
    rep = tokens / tp if sp else tokens
    pairs = tokens * model.top_k * etp / tp
    local = E / ep
    up = 2 if model.activation == "swiglu" else 1
    f = model.expert_ffn / etp
    router = [Gemm(rep, E, h)]
    experts = [Gemm(pairs / local, up * f, h, local), Gemm(pairs / local, h, f, local)]
    r_f, r_b = _gemms_time(router, hw, precision)
    x_f = x_b = 0.0
    for g in experts:  # grouped expert GEMMs, priced by expert shape (compute.grouped_gemm_fwd_bwd_s)
        f_, b_ = compute.grouped_gemm_fwd_bwd_s(g, hw.gpu, hw.params, precision)
        x_f, x_b = x_f + f_, x_b + b_
    g_f, g_b = r_f + x_f, r_b + x_b
    gemms = router + experts
    act = (3 if model.activation == "swiglu" else 2) * pairs * f
    # norm + residual, router softmax/top-k (fp32 logits), permute + unpermute (read + write pairs·h twice)
    traffic = A * rep * 5 * h + rep * E * 8 + A * pairs * h * 4 + A * act + _cast_bytes(gemms, precision)
    e_f = compute.memory_bound_s(traffic, 6, hw.gpu, hw.params)
    e_b = compute.memory_bound_s(2 * traffic, 10, hw.gpu, hw.params)
    fwd, bwd, tp_f = g_f + e_f + hw.params.moe_latency_s, g_b + e_b + hw.params.moe_latency_s, 0.0
    if model.num_shared_experts:
        s_f, s_b, tp_f = _mlp_block(model, hw, precision, tokens, tp, sp, model.shared_ffn, model.num_shared_experts,
                                    norm=False)
        fwd, bwd = fwd + s_f, bwd + s_b
    return fwd, bwd, tp_f, _ep_exchange(hw, tokens / tp * model.top_k * h * A, ep, etp, pairs * h * A, model, tp,
                                        impl)


def _ep_exchange(hw: Hardware, dispatch_bytes: float, ep: int, etp: int, gathered_bytes: float,
                 model: ModelSpec | None = None, tp: int = 1, impl: Implementation = MODERN) -> float:
    """Dispatch + combine over ep ranks spaced etp apart (+ all-gather / reduce-scatter of the routed tokens
    over etp when experts are tensor-parallel), by ``impl.moe_dispatcher``: alltoall (each token-expert pair
    travels; the default), flex (DeepEP: one network copy per remote node hit, comm.node_dedup_all_to_all),
    allgather (every rank gathers the tp x ep group's tokens; ``dispatch_bytes / top_k`` per rank)."""
    kind = impl.moe_dispatcher if model is not None else "alltoall"
    nvlink, nic = hw.intra(dispatch_bytes, ep, "alltoall"), hw.nic_gpu_at(dispatch_bytes, "alltoall")
    if kind == "flex":
        a2a = comm.node_dedup_all_to_all(ep, etp, hw.gpus_per_node, nvlink, nic, model.num_experts, model.top_k)
        t = 2 * a2a.time(dispatch_bytes)
    elif kind == "allgather":
        tokens_bytes = dispatch_bytes / model.top_k  # this rank's tokens, once each
        ag = comm.all_gather_dispatch(tp * ep, 1, hw.gpus_per_node, hw.nvlink, hw.nic_node)
        t = 2 * ag.time(tokens_bytes * tp * ep)
    else:
        a2a = comm.all_to_all(ep, etp, hw.gpus_per_node, nvlink, nic)
        t = 2 * a2a.time(dispatch_bytes)
    if etp > 1:
        t += 2 * comm.ring("all_gather", etp, hw.intra(gathered_bytes, etp, "all_gather")).time(gathered_bytes)
    return t


def layer_passes(model: ModelSpec, moe: bool, hw: Hardware, precision: str, tokens: float, seq: int, tp: int,
                 sp: bool, ep: int, etp: int, cp: int, impl: Implementation = MODERN) -> Passes:
    """All raw times of one decoder layer on one rank (``tokens`` = per-replica micro-batch x seq / cp)."""
    a_f, a_b, attn, tp_a, cp_f, cp_b = _attention_block(model, hw, precision, tokens, seq, tp, sp, cp, impl)
    if moe:
        m_f, m_b, tp_m, ep_f = _moe_block(model, hw, precision, tokens, tp, sp, ep, etp, impl)
    else:
        m_f, m_b, tp_m = _mlp_block(model, hw, precision, tokens, tp, sp, model.ffn_hidden)
        ep_f = 0.0
    sel, sel_ep = _selective_fwd_s(model, moe, hw, precision, tokens, tp, sp, etp, impl, attn, m_f)
    op = _op_sac_fwd_s(model, moe, hw, precision, tokens, tp, attn, a_f, m_f)
    return Passes(a_f + m_f, a_b + m_b, attn, tp_a + tp_m, ep_f, cp_f, cp_b, sel, sel_ep, op)


def _op_sac_fwd_s(model: ModelSpec, moe: bool, hw: Hardware, precision: str, tokens: float, tp: int,
                  attn_core_fwd: float, attn_fwd: float, mlp_fwd: float) -> float:
    """Seconds torchtitan's op-level SAC repeats in the backward (memory.op_sac_layer_bytes: what it saves): the
    even-numbered matmuls (wk, wo, w3 of a Llama block) and every memory-bound op (norms, RoPE, activation,
    residual adds); the SDPA and the odd matmuls are saved. MoE layers: the attention part only (their experts
    are modelled as saved)."""
    attn_gemm = _gemms_time(attention_gemms(model, tokens, tp), hw, precision)[0]
    t = attn_fwd - attn_gemm - attn_core_fwd  # attention block's memory-bound ops
    if not moe:
        t += mlp_fwd - _gemms_time(mlp_gemms(model, tokens, model.ffn_hidden, tp), hw, precision)[0]
    again = [Gemm(m, n, k) for m, n, k in op_sac_recomputed_matmuls(model, tokens, tp, moe)]
    return t + _gemms_time(again, hw, precision)[0]


def _selective_fwd_s(model: ModelSpec, moe: bool, hw: Hardware, precision: str, tokens: float, tp: int, sp: bool,
                     etp: int, impl: Implementation, attn_fwd: float, mlp_fwd: float) -> tuple[float, float]:
    """(seconds, EP exchanges) that selective recompute repeats in the backward, per Megatron-Core module in
    ``impl.recompute_modules`` (memory.layer_activation_bytes drops the matching activations): core_attn the
    core attention; layernorm the two norms (read h, write h each); mlp a dense layer's MLP; moe the whole
    MoE block (router, permutation, experts, shared experts) and its dispatch + combine; moe_act the
    experts' activation (read up·f, write f per token-expert pair); shared_experts the shared MLP;
    mla_up_proj MLA's query and key/value up-projections."""
    A, h = compute.act_bytes(precision), model.hidden
    rep = tokens / tp if sp else tokens
    t = 0.0
    if impl.recomputes("core_attn"):
        t += attn_fwd
    if impl.recomputes("layernorm"):
        t += compute.memory_bound_s(A * rep * 2 * h * 2, 2, hw.gpu, hw.params)
    if model.is_mla and impl.recomputes("mla_up_proj"):  # the q and kv up-projections (their latents are kept)
        ups = [g for g in mla_gemms(model, tokens, tp) if g.k in (model.q_lora_rank, model.kv_lora_rank)]
        t += _gemms_time(ups, hw, precision)[0]
    if not moe:
        return t + (mlp_fwd if impl.recomputes("mlp") else 0.0), 0.0
    if impl.recomputes("moe"):
        return t + mlp_fwd, 1.0
    if impl.recomputes("moe_act"):
        pairs, f = tokens * model.top_k * etp / tp, model.expert_ffn / etp
        up = 2 if model.activation == "swiglu" else 1
        t += compute.memory_bound_s(A * pairs * (up + 1) * f, 1, hw.gpu, hw.params)
    if model.num_shared_experts and impl.recomputes("shared_experts"):
        t += _mlp_block(model, hw, precision, tokens, tp, sp, model.shared_ffn, model.num_shared_experts,
                        norm=False)[0]
    return t, 0.0


def embedding_passes(model: ModelSpec, hw: Hardware, tokens: float, tp: int, precision: str = "bf16") -> Passes:
    """Vocab-parallel lookup (gather rows, write h), backward scatter-add into the fp32 gradient, one
    TP reduction of the output (all-reduce, or reduce-scatter with SP)."""
    h, A = model.hidden, compute.act_bytes(precision)
    fwd = compute.memory_bound_s(A * tokens * h * 2, 1, hw.gpu, hw.params)
    bwd = compute.memory_bound_s(tokens * h * (A + 8), 2, hw.gpu, hw.params)
    return Passes(fwd, bwd, 0.0, _tp_collective(hw, tp, tokens * h * A), 0.0, 0.0, 0.0)


def head_passes(model: ModelSpec, hw: Hardware, precision: str, tokens: float, tp: int, sp: bool) -> Passes:
    """Final norm, vocab-parallel LM head GEMM, fp32 cross-entropy over V/tp logits (+ 3 small all-reduces:
    max, sum, target logit), and with SP the all-gather of the norm output."""
    h, v, A = model.hidden, model.vocab_size / tp, compute.act_bytes(precision)
    g_f, g_b = _gemms_time([Gemm(tokens, v, h)], hw, precision)
    rep = tokens / tp if sp else tokens
    ce = tokens * v * 4.0 * 3  # fp32 logits: write, softmax read + write
    e_f = compute.memory_bound_s(A * rep * 2 * h + ce, 4, hw.gpu, hw.params)
    e_b = compute.memory_bound_s(A * rep * 2 * h + ce, 4, hw.gpu, hw.params)
    small = 3 * comm.ring("all_reduce", tp, hw.intra(tokens * 4.0, tp)).time(tokens * 4.0)
    return Passes(g_f + e_f, g_b + e_b, 0.0, _tp_collective(hw, tp, tokens * h * A) / 2 + small, 0.0, 0.0, 0.0)


def exposed(passes: Passes, recompute: str, cal: Calibration) -> tuple[float, float, float, float]:
    """(compute, tp, ep, cp) seconds per micro-batch after the calibrated hidden fractions."""
    g = cal.globals
    n = passes.passes(recompute)
    cp = passes.cp_fwd_s + passes.cp_bwd_s + (passes.cp_fwd_s if recompute == "full" else 0.0)
    return (passes.compute_s(recompute), (1 - g.tp_overlap) * n * passes.tp_fwd_s,
            (1 - g.ep_overlap) * passes.ep_passes(recompute) * passes.ep_fwd_s, cp)
