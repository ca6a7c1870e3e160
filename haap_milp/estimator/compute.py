"""On-GPU time of GEMMs, flash attention and memory-bound work (no communication).

GEMM model (roofline + fixed kernel cost; NVIDIA "Matrix Multiplication Background" guide,
DU-09799-001, ch. 2 math/memory bounds and ch. 3 tile/wave quantization)::

    t = max(F / (P · e_gemm), bytes / (HBM · e_hbm)) + t_kernel

``e_gemm`` (asymptotic efficiency) and ``t_kernel`` (fixed cost: launch, prologue/epilogue, the
partly empty last wave) are fitted per GPU type. The shape dependence comes from both terms: a
tp-sharded or small GEMM has few FLOPs, so ``t_kernel`` is a larger share, and a skinny one has low
arithmetic intensity, so HBM bounds it. Flash attention runs at its own fitted efficiency.
"""

from __future__ import annotations

from haap_milp.estimator.calibration import GpuParams
from haap_milp.estimator.flops import Gemm
from haap_milp.specs import GPUSpec

ACT_BYTES = 2  # bf16/fp16 activations (fp8 recipes keep activations in bf16 between GEMMs)


def act_bytes(precision: str) -> float:
    """Bytes per activation element: 4 in fp32 / tf32 training (fp32 tensors; tf32 only changes the GEMM
    units), else 2."""
    return 4.0 if precision in ("fp32", "tf32") else ACT_BYTES

# Flash-attention backward recomputes the scores: 5 GEMM-like products vs 2 forward (Dao, FlashAttention-2
# (2023) sec. 3.1.2), i.e. 2.5x the forward FLOPs.
FLASH_BWD_FACTOR = 2.5


def peak_flops(gpu: GPUSpec, precision: str) -> float:
    """Dense peak FLOP/s of the GEMM units ``precision`` runs on; 0 where the GPU lacks it (callers reject that
    earlier). fp32 training runs its GEMMs on TF32 tensor cores where the GPU has them and on CUDA cores
    otherwise (V100, T4): PyTorch's ``allow_tf32`` (on for cuDNN, and for matmul in PyTorch 1.7-1.11 and
    wherever the framework sets it; Megatron-LM and DeepSpeed's examples do) - the measured OPT-350M fp32
    profiles (tests/data/profiles/OPT-350) run faster than A100's 19.5 TFLOP/s CUDA-core peak allows."""
    if precision == "fp32":
        return (gpu.tf32_tflops or gpu.fp32_tflops or 0.0) * 1e12
    return (gpu.peak_tflops(precision) or 0.0) * 1e12


#: Efficiency of fp32 GEMMs on CUDA cores (SIMT SGEMM; V100, T4 - GPUs without TF32). The calibrated
#: ``gemm_eff_16`` is a tensor-core figure (operand staging, tile quantisation at 16-bit); SIMT SGEMM is
#: register-blocked FMA work that cuBLAS runs near its peak: Jia et al., "Dissecting the NVIDIA Volta GPU
#: Architecture via Microbenchmarking" (2018), sec. 6 - cuBLAS SGEMM on V100 about 14 of its 15.7 TFLOP/s.
#: Checked, not fitted, against the measured OPT-350M V100 profile (tests/test_fp32_pricing.py).
SIMT_SGEMM_EFF = 0.85


def gemm_rate(gpu: GPUSpec, p: GpuParams, precision: str) -> float:
    """Achievable FLOP/s of the GEMM units ``precision`` runs on: tensor cores at the calibrated efficiency,
    or CUDA cores at ``SIMT_SGEMM_EFF`` when fp32 has no TF32 units to run on."""
    if precision == "fp32" and not gpu.tf32_tflops:
        return peak_flops(gpu, precision) * SIMT_SGEMM_EFF
    return peak_flops(gpu, precision) * p.gemm_eff(precision)


def hbm_bytes_per_s(gpu: GPUSpec, p: GpuParams) -> float:
    return gpu.hbm_bandwidth_gbps * 1e9 * p.hbm_eff


def gemm_time_s(g: Gemm, gpu: GPUSpec, p: GpuParams, precision: str) -> float:
    """One (grouped) GEMM: roofline of compute and HBM traffic, plus one kernel's fixed cost."""
    return _gemm_s(g.m, g.n, g.k, g.count, *_gemm_units(gpu, p, precision))


def _gemm_units(gpu: GPUSpec, p: GpuParams, precision: str) -> tuple[float, float, float, float, float]:
    """(input bytes, output bytes per element, FLOP/s, HBM bytes/s, fixed cost s) of ``gemm_time_s``, read once for
    the GEMMs of a layer (the presolve of llama3-70b x 256 GPUs x 3 types x 2 islands prices ~100 k GEMMs)."""
    out_bytes = act_bytes(precision)
    return (1 if precision == "fp8" else out_bytes), out_bytes, gemm_rate(gpu, p, precision), \
        hbm_bytes_per_s(gpu, p), p.kernel_latency_s


def _gemm_s(m: float, n: float, k: float, count: float, in_bytes: float, out_bytes: float, rate: float,
            hbm: float, latency: float) -> float:
    """``gemm_time_s`` of C[m, n] = A[m, k] @ B[k, n] x count at the units ``_gemm_units`` read (s)."""
    traffic = count * (in_bytes * (m * k + k * n) + out_bytes * m * n)
    compute = 2.0 * m * n * k * count / rate  # (Gemm.flops / rate)
    return max(compute, traffic / hbm) + latency


def gemm_fwd_bwd_s(g: Gemm, gpu: GPUSpec, p: GpuParams, precision: str) -> tuple[float, float]:
    """Forward GEMM, and backward = input-gradient GEMM [m,n]x[n,k] + weight-gradient GEMM [k,m]x[m,n]."""
    return gemms_fwd_bwd_s([g], gpu, p, precision)


def gemms_fwd_bwd_s(gemms: list[Gemm], gpu: GPUSpec, p: GpuParams, precision: str) -> tuple[float, float]:
    """``gemm_fwd_bwd_s`` summed over ``gemms`` in order (forward, backward), the units read once."""
    units = _gemm_units(gpu, p, precision)
    fwd = bwd = 0.0
    for g in gemms:
        m, n, k, c = g.m, g.n, g.k, g.count
        fwd += _gemm_s(m, n, k, c, *units)
        bwd += _gemm_s(m, k, n, c, *units) + _gemm_s(k, n, m, c, *units)
    return fwd, bwd


def grouped_gemm_fwd_bwd_s(g: Gemm, gpu: GPUSpec, p: GpuParams, precision: str) -> tuple[float, float]:
    """Routed-expert GEMMs: ``g.count`` local experts of ``g.m`` tokens each. Transformer Engine's GroupedLinear
    (Megatron-Core TEGroupedMLP) runs one cuBLAS GEMM per expert, so each pays the fixed kernel cost; the
    roofline part runs at the dense efficiency x ``grouped_gemm_eff`` (routing residue) x m / (m + m_half):
    few tokens per expert leave the last tile wave and the prologue/epilogue a larger share (NVIDIA Matrix
    Multiplication Background guide ch. 3, tile and wave quantization), ``grouped_m_half`` (fitted) is the
    tokens per expert at which that factor is one half."""
    one = Gemm(g.m, g.n, g.k, 1.0)
    f, b = gemm_fwd_bwd_s(one, gpu, p, precision)  # each includes its kernels' fixed cost (1 fwd, 2 bwd)
    eff = p.grouped_gemm_eff * g.m / (g.m + p.grouped_m_half) if g.m > 0 else p.grouped_gemm_eff
    lat = p.kernel_latency_s
    (g_f, g_b), (q_f, q_b) = expert_launches(precision)
    fixed_f = g_f * p.expert_latency_s + q_f * g.m * p.fp8_pair_s
    fixed_b = g_b * p.expert_latency_s + q_b * g.m * p.fp8_pair_s
    return (g.count * ((f - lat) / eff + lat + fixed_f), g.count * ((b - 2 * lat) / eff + 2 * lat + fixed_b))


def expert_launches(precision: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Per-expert costs of one expert linear layer: ((GEMM launches fwd, bwd), (fp8-quantized inputs fwd, bwd)).
    GEMMs: 1 forward, 2 backward (dgrad, wgrad), each charged ``GpuParams.expert_latency_s`` per local expert.
    fp8: the permuted input (forward) and the output gradient (backward) are quantized (Transformer Engine's
    GroupedLinear, with the transposed copy the wgrad GEMM needs on Hopper), each charged ``GpuParams.fp8_pair_s``
    per routed token-expert pair - a per-row cost, fitted on the fp8 MoE rows (calibration.PRIOR_SOURCES says why
    per pair and not per expert or per byte)."""
    return (1, 2), ((1, 1) if precision == "fp8" else (0, 0))


def attention_fwd_bwd_s(flops_fwd: float, gpu: GPUSpec, p: GpuParams, precision: str) -> tuple[float, float]:
    """Flash attention at the fitted efficiency of the 16-bit peak (fp8 recipes keep attention in bf16)."""
    peak = peak_flops(gpu, "fp16" if precision == "fp16" else "bf16") or peak_flops(gpu, "fp16")
    rate = peak * p.attn_eff
    fwd = flops_fwd / rate + p.kernel_latency_s
    return fwd, FLASH_BWD_FACTOR * flops_fwd / rate + 2 * p.kernel_latency_s


def attention_unfused_fwd_bwd_s(tokens: float, seq: float, heads: float, dim_head: int, gpu: GPUSpec, p: GpuParams,
                                precision: str, dropout: bool) -> tuple[float, float]:
    """Unfused attention of ``heads`` local heads (2021 Megatron): batched GEMMs QK^T [s,dh]x[dh,s] and AV
    [s,s]x[s,dh] per (sequence, head) over the full square, then the softmax chain on the scores, and dropout
    on them (read a, write a + 1-byte mask; backward read a + mask, write a).

    16-bit: the fused scale-mask-softmax kernel (read + write a per score; backward twice the traffic).
    fp32 / tf32: no fused kernel (Megatron's FusedScaleMaskSoftmax fuses 16-bit inputs only; HF attention is
    unfused too), so scale, mask and softmax are three torch kernels of read + write a each in the forward;
    the backward runs softmax's (read y and dy, write dx: 3a), the mask's and the scale's (2a each)."""
    seqs = tokens / seq * heads
    prec = precision if precision in ("fp16", "fp32", "tf32") else "bf16"
    a = act_bytes(precision)
    qk, av = Gemm(seq, seq, dim_head, seqs), Gemm(seq, dim_head, seq, seqs)
    f1, b1 = gemm_fwd_bwd_s(qk, gpu, p, prec)
    f2, b2 = gemm_fwd_bwd_s(av, gpu, p, prec)
    scores = seqs * seq * seq
    drop = 2 * a + 1 if dropout else 0.0
    if prec in ("fp32", "tf32"):
        fwd_b, bwd_b, fwd_k, bwd_k = 6 * a + drop, 7 * a + drop, 3 + dropout, 3 + dropout
    else:
        fwd_b, bwd_b, fwd_k, bwd_k = 2 * a + drop, 2 * (2 * a + drop), 2, 2
    return (f1 + f2 + memory_bound_s(scores * fwd_b, fwd_k, gpu, p),
            b1 + b2 + memory_bound_s(scores * bwd_b, bwd_k, gpu, p))



def memory_bound_s(traffic_bytes: float, kernels: int, gpu: GPUSpec, p: GpuParams) -> float:
    """Elementwise / normalisation / permutation work: HBM traffic at achievable bandwidth + kernel costs."""
    return traffic_bytes / hbm_bytes_per_s(gpu, p) + kernels * p.kernel_latency_s


def optimizer_step_s(params: float, gpu: GPUSpec, p: GpuParams, precision: str = "bf16") -> float:
    """Fused Adam on ``params`` local parameters: memory-bound, reads fp32 master, m, v, fp32 grad and
    writes master, m, v and the 16-bit copy = 4·4 + 3·4 + 2 = 30 bytes/param (apex/TE multi-tensor Adam);
    + 4 bytes/param for the gradient-norm pass (clip_grad_norm) = 34. Pure fp32 / tf32 training has no
    16-bit copy and no separate master: reads w, g, m, v, writes w, m, v = 28, + 4 = 32."""
    return params * (32.0 if precision in ("fp32", "tf32") else 34.0) / hbm_bytes_per_s(gpu, p)
