"""Issue #12: per-local-expert launch cost of the grouped expert GEMMs and the fp8 cost per routed pair, bf16 main
gradients of NVIDIA's performance recipes, FSDP overlap contention (eq. Z4b), and the fitted model on the calibration
rows (in-sample and leave-one-out)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from estimator_helpers import H100, LLAMA_8B, cluster, training, uniform_plan
from measured_runs import bf16_grad_recipe, error_pct, estimator_for, load_rows, predict_time_s, to_run

from haap_milp.estimator import compute, costs, memory
from haap_milp.estimator.calibration import GpuParams, load_calibration
from haap_milp.estimator.cost_model import Estimator
from haap_milp.estimator.flops import Gemm

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "measured_runs.json"


def test_expert_latency_is_charged_per_local_expert_and_launch():
    """bf16 and fp8: 1 forward and 2 backward GEMM launches per local expert at expert_latency_s; fp8 also one
    quantized input per pass (forward: the permuted input; backward: the output gradient) at fp8_pair_s per routed
    token-expert pair - the same at 16 experts of 2,048 tokens as at 8 of 4,096; bf16 never pays it."""
    p = GpuParams(kernel_latency_s=5e-6, grouped_gemm_eff=1.0, grouped_m_half=0.0)
    lat, q = 40e-6, 60e-9
    g = Gemm(2048, 1536, 2048, 16)
    for prec, (nq_f, nq_b) in (("bf16", (0, 0)), ("fp8", (1, 1))):
        assert compute.expert_launches(prec) == ((1, 2), (nq_f, nq_b))
        f0, b0 = compute.grouped_gemm_fwd_bwd_s(g, H100, p, prec)
        f1, b1 = compute.grouped_gemm_fwd_bwd_s(g, H100, replace(p, expert_latency_s=lat), prec)
        assert f1 - f0 == pytest.approx(16 * lat) and b1 - b0 == pytest.approx(16 * 2 * lat)
        f2, b2 = compute.grouped_gemm_fwd_bwd_s(g, H100, replace(p, fp8_pair_s=q), prec)
        assert f2 - f0 == pytest.approx(16 * 2048 * nq_f * q) and b2 - b0 == pytest.approx(16 * 2048 * nq_b * q)
        half = Gemm(4096, 1536, 2048, 8)
        h0 = compute.grouped_gemm_fwd_bwd_s(half, H100, p, prec)[0]
        h2 = compute.grouped_gemm_fwd_bwd_s(half, H100, replace(p, fp8_pair_s=q), prec)[0]
        assert h2 - h0 == pytest.approx(f2 - f0)  # per pair, not per expert


def test_grad_reduce_in_bf16_halves_the_grad_buffer_and_its_reduction():
    assert costs.grad_bytes("bf16") == 4.0 and costs.grad_bytes("bf16", False) == 2.0
    assert costs.grad_bytes("fp16") == 2.0 and costs.grad_bytes("fp32", False) == 4.0
    assert memory.param_bytes("bf16", 1, 8, 12.0, grad_element_bytes=2.0).grads == 2.0
    plan = uniform_plan(LLAMA_8B, "h100-80g", 2, 1, 16, 1, 64, 4096)
    est32 = Estimator(LLAMA_8B, cluster(nodes=4), training(64, 4096))
    est16 = Estimator(LLAMA_8B, cluster(nodes=4), training(64, 4096, grad_reduce_in_fp32=False))
    c32 = est32.layer_cost("h100-80g", 2, 16, 1, 1, "none", 16)
    c16 = est16.layer_cost("h100-80g", 2, 16, 1, 1, "none", 16)
    assert c16.grads_bytes == pytest.approx(c32.grads_bytes / 2)
    assert c16.weights_bytes == c32.weights_bytes and c16.optimizer_bytes == c32.optimizer_bytes
    assert c16.dp_comm_s < c32.dp_comm_s
    assert est16.estimate(plan).peak_memory_gib < est32.estimate(plan).peak_memory_gib


def test_bf16_grads_only_for_nvidia_performance_recipes():
    rows = {r["id"]: r for r in load_rows(DATA)}
    assert bf16_grad_recipe(rows["dgxc_nemotron4_340b_bf16_128"])  # NeMo 24.11 performance recipe
    assert bf16_grad_recipe(rows["mb2602_h100_qwen3_30b_fp8_16"])  # Megatron-Bridge
    assert not bf16_grad_recipe(rows["nemo2407_h100_fp8_LLAMA2-70B"])  # NeMo 24.07 (NeMo 1 configs)
    assert not bf16_grad_recipe(rows["sc21_gpt_18B"]) and not bf16_grad_recipe(rows["modelzoo_qwen3_235b_h100_bf16_b"])


def _errors(category: str) -> dict[str, float]:
    cal = load_calibration()
    out = {}
    for row in load_rows(DATA):
        run = to_run(row)
        if run.plan is not None and run.complete and run.category == category:
            out[run.id] = error_pct(predict_time_s(run, estimator_for(run, cal)), run.measured_time_s)
    return out


def test_moe_rows_in_sample_mape_and_the_qwen3_30b_rows():
    """No MoE row is an outlier: in-sample MAPE <= 8 % over all complete MoE rows (DeepSeek-V3 with MLA included);
    the Qwen3-30B-A3B fp8 rows (16 local experts of 768 x 2048; 52-59 % too fast before the per-expert terms, and
    29 % at micro-batch 2 with a per-expert fp8 cost) both within 12 % with the per-pair fp8 cost."""
    err = _errors("moe")
    assert len(err) >= 13 and "mb2509_h100_dsv3_dropless_1024" in err
    assert statistics.mean(abs(e) for e in err.values()) <= 8.0
    assert abs(err["mb2602_h100_qwen3_30b_fp8_16"]) <= 12.0
    assert abs(err["mb2511_h100_qwen3_30b_fp8_16"]) <= 12.0


def test_qwen3_30b_on_another_stack_never_fitted():
    """NeMo AutoModel (FSDP2 + TE + DeepEP, bf16, mbs 4) runs the same Qwen3-30B-A3B at 2.35x the Megatron-Bridge fp8
    rows' tokens/s/GPU; the row is never fitted (incomplete: activation checkpointing not stated) and the fitted
    per-expert cost (amortised over 4x the tokens, no fp8 quantization) predicts it within 15 %."""
    from measured_runs import stack

    row = next(r for r in load_rows(DATA) if r["id"] == "automodel_h100_qwen3_30b_bf16_8")
    run = to_run(row)
    assert stack(row) == "nemo-automodel" and not run.complete and run.impl.moe_dispatcher == "flex"
    assert abs(error_pct(predict_time_s(run, estimator_for(run, load_calibration())), run.measured_time_s)) <= 15.0


def test_last_stage_keeps_one_microbatch_of_logits_unless_gpipe():
    from haap_milp.estimator import schedule

    assert schedule.loss_inflight("interleaved", 16) == 1.0 and schedule.loss_inflight("1f1b", 16) == 1.0
    assert schedule.loss_inflight("gpipe", 16) == 16.0
    est = Estimator(LLAMA_8B, cluster(nodes=4), training(64, 4096))
    inter = est.estimate(uniform_plan(LLAMA_8B, "h100-80g", 2, 4, 4, 1, 64, 4096, vpp=2))
    last = inter.stages[-1]
    head = est.last_stage_extra("h100-80g", 2, 4, 1, 1, "none", 4).act_bytes / 2**30
    layer = est.layer_cost("h100-80g", 2, 4, 1, 1, "none", 4).act_bytes / 2**30
    assert last.inflight_microbatches > 1
    assert last.breakdown["activations_gib"] == pytest.approx(last.num_layers * last.inflight_microbatches * layer + head)


def test_overlap_contention_eq_z4b_on_zero3_stages():
    """Eq. Z4b: a ZeRO-3 stage under the fsdp runtime pays k·min(comm, compute) per overlapped pass on top of
    eq. Z4's exposed part; ZeRO 0/1 (per-step collectives) and a runtime that does not overlap pay nothing more."""
    from haap_milp.estimator import comm
    from haap_milp.specs import TrainingSpec

    cal = load_calibration()
    tr = TrainingSpec(global_batch_size=64, seq_len=2048, engine="fsdp")
    base = replace(cal, globals=replace(cal.globals, overlap_slowdown=0.0))
    k = 0.5
    slow = replace(cal, globals=replace(cal.globals, overlap_slowdown=k))
    args = ("h100-80g", 1, 16, 1, 1, "none", 16)
    c0 = Estimator(LLAMA_8B, cluster(nodes=2), tr, base).layer_cost(*args, zero=3)
    c1 = Estimator(LLAMA_8B, cluster(nodes=2), tr, slow).layer_cost(*args, zero=3)
    assert c1.zero3_comm_s > c0.zero3_comm_s > 0.0
    assert c1.time_s - c0.time_s == pytest.approx(c1.zero3_comm_s - c0.zero3_comm_s)
    assert comm.overlap_contention_s(2.0, 3.0, k) == pytest.approx(1.0) and comm.overlap_contention_s(5.0, 3.0, k) == 1.5
    z1 = [Estimator(LLAMA_8B, cluster(nodes=2), tr, c).layer_cost(*args, zero=1).time_s for c in (base, slow)]
    assert z1[0] == z1[1]


def test_leave_one_out_targets_of_issue_12():
    """Issue #12's bar on the calibration set, leave-one-out (one Gauss-Newton refit without each row, from the
    packaged calibration; calibrate.gauss_newton_loo): MAPE <= 8 % dense, <= 12 % MoE, no row beyond 25 %. Fails
    when a model change or a refit makes any of them worse than the bar."""
    import sys

    sys.path.insert(0, str(DATA.parents[1]))
    from calibrate import Fit, gauss_newton_loo

    rows = load_rows(DATA)
    runs = [to_run(r) for r in rows]
    targets = [r for r in runs if r.plan is not None and r.complete]
    pred = gauss_newton_loo(Fit(rows, runs=runs), load_calibration(), targets)
    err = {r.id: (r.category, error_pct(pred[r.id], r.measured_time_s)) for r in targets}
    dense = [abs(e) for c, e in err.values() if c == "dense"]
    moe = [abs(e) for c, e in err.values() if c == "moe"]
    assert len(dense) >= 50 and len(moe) >= 13
    assert statistics.mean(dense) <= 8.0 and statistics.mean(moe) <= 12.0
    assert max(dense + moe) <= 25.0, sorted(err.items(), key=lambda kv: -abs(kv[1][1]))[:3]
