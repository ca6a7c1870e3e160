"""Time model: eq. T1 consistency with problem.py, breakdowns, physics, errors, speed of the cache."""

from __future__ import annotations

import time

import numpy as np
import pytest
from estimator_helpers import (
    A100,
    H100,
    LLAMA_8B,
    LLAMA_70B,
    MOE,
    V100,
    cluster,
    hetero_cluster,
    training,
    uniform_plan,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from haap_milp import problem as pb
from haap_milp.check import check_plan
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator, compute, schedule
from haap_milp.estimator.calibration import load_calibration
from haap_milp.estimator.flops import Gemm
from haap_milp.specs import Plan, StagePlan


def _problem_for(est: Estimator, plan: Plan) -> tuple[pb.Problem, pb.Assignment]:
    """A one-variant Problem whose options are the plan's stage configurations (what presolve builds)."""
    b = plan.samples_per_microbatch
    groups = sorted({(s.gpu_type, s.island) for s in plan.stages})
    keys = sorted({(groups.index((s.gpu_type, s.island)), s.tp, s.dp, s.recompute) for s in plan.stages})
    opts = tuple(pb.Option(g, tp, dp, 1, r) for g, tp, dp, r in keys)
    arr = {k: np.zeros(len(opts)) for k in ("lt", "ft", "xt", "ls", "la", "fs", "fa", "xs", "xa", "fx", "cap",
                                            "sf", "sl", "s1", "sL")}
    for i, o in enumerate(opts):
        gpu, isl = groups[o.group]
        args = (gpu, o.tp, o.dp, 1, 1, o.recompute, b)
        lc, fc, xc = (f(*args, island=isl) for f in (est.layer_cost, est.first_stage_extra, est.last_stage_extra))
        vals = (lc.time_s, fc.time_s, xc.time_s, lc.static_bytes, lc.act_bytes, fc.static_bytes, fc.act_bytes,
                xc.static_bytes, xc.act_bytes,
                est.stage_fixed_bytes(gpu, o.tp, dp=o.dp, recompute=o.recompute, samples_per_microbatch=b),
                est.usable_memory_bytes(gpu),
                est.stage_fixed_sync_s(gpu, isl, o.tp, o.dp), lc.sync_s, fc.sync_s, xc.sync_s)
        for k, v in zip(arr, vals):
            arr[k][i] = v
    p2p = np.zeros((len(groups), len(groups)))
    for sa, sb in zip(plan.stages, plan.stages[1:]):
        x, y = groups.index((sa.gpu_type, sa.island)), groups.index((sb.gpu_type, sb.island))
        p2p[x, y] = est.p2p_time((sa.gpu_type, sa.island), (sb.gpu_type, sb.island), b, sa.tp, sb.tp,
                                 dp_a=sa.dp, dp_b=sb.dp)
    var = pb.Variant(b, plan.num_microbatches, arr["lt"], arr["ft"], arr["xt"], arr["ls"], arr["la"], arr["fs"],
                     arr["fa"], arr["xs"], arr["xa"], arr["fx"], arr["cap"], arr["sf"], arr["sl"], arr["s1"],
                     arr["sL"], p2p, np.ones(len(opts), dtype=bool))
    prob = pb.Problem(est.model.num_layers, plan.pp, tuple(f"{g}@{i}" for g, i in groups), (64,) * len(groups),
                      opts, (var,))
    stages = tuple(pb.Stage(keys.index((groups.index((s.gpu_type, s.island)), s.tp, s.dp, s.recompute)),
                            s.num_layers) for s in plan.stages)
    return prob, pb.Assignment(0, stages)


def _hetero_plan() -> Plan:
    st = (StagePlan(first_layer=0, num_layers=12, gpu_type="h100-80g", island="east", tp=4, dp=2),
          StagePlan(first_layer=12, num_layers=14, gpu_type="h100-80g", island="east", tp=2, dp=4, recompute="full"),
          StagePlan(first_layer=26, num_layers=6, gpu_type="a100-80g", island="west", tp=8, dp=2))
    return Plan(model="llama3-8b", stages=st, micro_batch_size=2, num_microbatches=8, global_batch_size=32,
                seq_len=4096)


@pytest.mark.parametrize("which", ["uniform", "hetero"])
def test_estimate_equals_problem_eq_t1_and_m2(which):
    if which == "uniform":
        est = Estimator(LLAMA_70B, cluster(nodes=8), training(64, 4096))
        plan = uniform_plan(LLAMA_70B, "h100-80g", tp=8, pp=4, dp=2, mbs=1, gbs=64, seq=4096)
    else:
        est = Estimator(LLAMA_8B, hetero_cluster(), training(32, 4096))
        plan = _hetero_plan()
    prob, assign = _problem_for(est, plan)
    assert pb.violations(prob, assign) == []  # both plans fit, and the checker agrees
    assert check_plan(plan, est.model, est.cluster, est.training, estimator=est) == []
    assert len({(s.gpu_type, s.tp, s.dp, s.recompute) for s in plan.stages}) == (1 if which == "uniform" else 3)
    pe = est.estimate(plan)
    assert pe.iteration_time_s == pytest.approx(pb.evaluate(prob, assign), rel=1e-9)
    mems = pb.stage_memory(prob, assign)
    assert any(s.recompute == "full" for s in plan.stages) == (which == "hetero")
    for s, m in zip(pe.stages, mems):  # full recompute's transient comes in through stage_fixed_bytes' kwargs
        assert s.memory_gib * 2**30 == pytest.approx(m, rel=1e-12)
    assert [s.time_s for s in pe.stages] == pytest.approx(pb.stage_times(prob, assign), rel=1e-12)


def test_breakdowns_sum_to_totals():
    est = Estimator(LLAMA_8B, hetero_cluster(), training(32, 4096))
    pe = est.estimate(_hetero_plan())
    for s in pe.stages:
        secs = sum(v for k, v in s.breakdown.items() if k.endswith("_s"))
        assert secs == pytest.approx(pe.iteration_time_s, rel=1e-9)
        assert s.breakdown["bubble_s"] >= -1e-9
    lc = est.layer_cost("h100-80g", 2, 4, 1, 1, "full", 8)
    assert lc.time_s == pytest.approx(lc.compute_s + lc.tp_comm_s + lc.ep_comm_s + lc.cp_comm_s)
    assert lc.static_bytes == pytest.approx(lc.weights_bytes + lc.grads_bytes + lc.optimizer_bytes)
    assert lc.sync_s >= lc.optimizer_s > 0


def test_interleaved_closed_form():
    t, m, p, v = 1.0, 16, 4, 3
    got = schedule.iteration_time("interleaved", [t] * p, [0.0] * (p - 1), [0.0] * p, m, v)
    assert got == pytest.approx(m * t + (p - 1) * t / v)
    assert schedule.iteration_time("1f1b", [t] * p, [0.0] * (p - 1), [0.0] * p, m) == pytest.approx((m + p - 1) * t)


@settings(max_examples=25, deadline=None)
@given(slow=st.floats(5, 100), factor=st.floats(1.0, 20.0), tp=st.sampled_from([1, 2, 4, 8]),
       pp=st.sampled_from([1, 2, 4]))
def test_a_slower_link_never_makes_a_plan_faster(slow, factor, tp, pp):
    dp = 32 // (tp * pp)
    plan = uniform_plan(LLAMA_8B, "h100-80g", tp, pp, dp, 1, 64, 4096)
    times = [Estimator(LLAMA_8B, cluster(nodes=4, nic_gbps=bw), training(64, 4096)).estimate(plan).iteration_time_s
             for bw in (slow, slow * factor)]
    assert times[0] >= times[1] * (1 - 1e-12)


@settings(max_examples=15, deadline=None)
@given(link=st.floats(0.5, 50), factor=st.floats(1.0, 20.0))
def test_a_slower_island_link_never_makes_a_plan_faster(link, factor):
    plan = _hetero_plan()
    times = [Estimator(LLAMA_8B, hetero_cluster(bw), training(32, 4096)).estimate(plan).iteration_time_s
             for bw in (link, link * factor)]
    assert times[0] >= times[1] * (1 - 1e-12)


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2), (8, 1), (4, 2)])
def test_fewer_gpus_never_raise_throughput(tp, pp):
    est = Estimator(LLAMA_8B, cluster(nodes=8), training(128, 4096))
    tps = []
    for dp in (1, 2, 4, 8):
        plan = uniform_plan(LLAMA_8B, "h100-80g", tp, pp, dp, 1, 128, 4096)
        tps.append(est.estimate(plan).tokens_per_s)
    assert tps == sorted(tps)
    assert est.compute_bound().tokens_per_s >= max(tps)


def test_gemm_efficiency_depends_on_shape():
    cal = load_calibration()
    p = cal.params(H100)

    def achieved(g: Gemm) -> float:
        return g.flops / compute.gemm_time_s(g, H100, p, "bf16") / 989.4e12

    big, sharded, small = Gemm(8192, 28672, 8192), Gemm(8192, 28672 // 8, 8192 // 8), Gemm(2048, 1024, 1024)
    assert achieved(big) > achieved(sharded) > achieved(small)
    assert achieved(small) < 0.6 * achieved(big)


def test_layer_time_grows_with_the_micro_batch_and_recompute():
    est = Estimator(LLAMA_70B, cluster(nodes=8), training(64, 4096))
    t = [est.layer_cost("h100-80g", 8, 1, 1, 1, "none", b).time_s for b in (1, 2, 4, 8)]
    assert t == sorted(t) and t[-1] < 8 * t[0]  # bigger micro-batches run more efficiently
    r = [est.layer_cost("h100-80g", 8, 1, 1, 1, rc, 2).time_s for rc in ("none", "selective", "full")]
    assert r == sorted(r)


def test_moe_expert_parallel_comm_and_placement():
    est = Estimator(MOE, cluster(nodes=4), training(64, 4096))
    intra = est.layer_cost("h100-80g", 1, 8, 8, 1, "none", 8)
    inter = est.layer_cost("h100-80g", 1, 16, 16, 1, "none", 16)
    assert intra.ep_comm_s > 0 and est.layer_cost("h100-80g", 1, 8, 1, 1, "none", 8).ep_comm_s == 0
    assert inter.ep_comm_s > intra.ep_comm_s  # crossing nodes: the NIC share, not NVLink


def test_p2p_uses_the_real_link():
    est = Estimator(LLAMA_8B, hetero_cluster(link_gbps=5.0), training(32, 4096))
    same = est.p2p_time(("h100-80g", "east"), ("h100-80g", "east"), 8, 4, 4, dp_a=2, dp_b=2)
    cross = est.p2p_time(("h100-80g", "east"), ("a100-80g", "west"), 8, 4, 4, dp_a=2, dp_b=2)
    assert cross > same > 0


@pytest.mark.parametrize("args,field", [
    (("h100-80g", 16, 1, 1, 1, "none", 1), "tp"),
    (("h100-80g", 3, 1, 1, 1, "none", 1), "tp"),
    (("h100-80g", 1, 3, 1, 1, "none", 4), "dp"),
    (("h100-80g", 1, 1, 2, 1, "none", 1), "ep"),
    (("b200", 1, 1, 1, 1, "none", 1), "gpu_type"),
    (("h100-80g", 1, 1, 1, 1, "sometimes", 1), "recompute"),
])
def test_impossible_stage_configs_raise(args, field):
    est = Estimator(LLAMA_8B, cluster(), training(64, 4096))
    with pytest.raises(HaapInputError) as exc:
        est.layer_cost(*args)
    assert exc.value.field == field


def test_precision_unsupported_by_the_gpu():
    est = Estimator(LLAMA_8B, cluster(V100, nodes=1, nic_gbps=50), training(8, 2048, precision="bf16"))
    with pytest.raises(HaapInputError, match="bf16"):
        est.layer_cost("v100-16g", 1, 1, 1, 1, "none", 1)


def test_cache_is_fast_and_counts():
    est = Estimator(LLAMA_70B, ClusterLike.big(), training(512, 4096))
    keys = [("h100-80g", tp, dp, 1, 1, rc, b) for tp in (1, 2, 4, 8) for dp in (1, 2, 4, 8) for b in (8, 16, 32)
            for rc in ("none", "selective", "full")]
    t0 = time.perf_counter()
    for k in keys:
        est.layer_cost(*k)
    uncached = (time.perf_counter() - t0) / len(keys)
    t0 = time.perf_counter()
    for _ in range(20):
        for k in keys:
            est.layer_cost(*k)
    cached = (time.perf_counter() - t0) / (20 * len(keys))
    stats = est.cache_stats()
    assert stats["layer_cost_misses"] == len(keys) and stats["layer_cost_hits"] == 20 * len(keys)
    assert stats["layer_passes_hits"] > 0  # the dp-independent part is shared across dp values
    assert cached < 50e-6 and uncached < 2e-3, (cached, uncached)


class ClusterLike:
    @staticmethod
    def big():
        return cluster(H100, nodes=16)


def test_mixed_precision_gpu_peaks_in_mfu():
    """Heterogeneous MFU divides by the sum of each used GPU's own peak."""
    est = Estimator(LLAMA_8B, hetero_cluster(), training(32, 4096))
    pe = est.estimate(_hetero_plan())
    peak = (8 + 8) * 989.4e12 + 16 * 312e12
    assert pe.mfu == pytest.approx(pe.tflops_per_gpu * 1e12 * pe.num_gpus / peak, rel=1e-9)
    assert 0 < pe.mfu < pe.hfu < 1
    assert A100.bf16_tflops < H100.bf16_tflops


def test_p2p_models():
    """'group' (default) depends only on the two groups and B, as problem.py's table needs; 'per_gpu' uses
    the plan's tp/dp and is never faster than 'group' (which assumes the whole smaller group sends)."""
    plan = _hetero_plan()
    grp = Estimator(LLAMA_8B, hetero_cluster(40.0), training(32, 4096))
    per = Estimator(LLAMA_8B, hetero_cluster(40.0), training(32, 4096), p2p_model="per_gpu")
    a, b = ("h100-80g", "east"), ("a100-80g", "west")
    assert grp.p2p_time(a, b, 16) == grp.p2p_time(a, b, 16, 4, 8, dp_a=2, dp_b=2)
    assert per.p2p_time(a, b, 16, 2, 8, dp_a=4, dp_b=2) >= grp.p2p_time(a, b, 16)
    assert per.estimate(plan).iteration_time_s >= grp.estimate(plan).iteration_time_s
    with pytest.raises(HaapInputError):
        Estimator(LLAMA_8B, cluster(), training(), p2p_model="magic")
