"""The schedule's closed forms in haap_milp/pipeline.py: hand-computed values on tiny inputs, and the
promise that the solver's objective, the estimator and the simulator's closed form all use them."""

from __future__ import annotations

import numpy as np
import pytest

from haap_milp import pipeline, planner
from haap_milp.catalog import load_cluster, load_model
from haap_milp.parallel_rules import ep_fits_grid, tp_allowed, tp_head_misfits
from haap_milp.problem import boundary_times, evaluate, stage_memory, stage_times, sync_times
from haap_milp.simulate import closed_form_iteration_s, plan_timings
from haap_milp.specs import SolveOptions, TrainingSpec


def test_inflight_counts():
    assert pipeline.inflight_1f1b(3, 2) == 2 and pipeline.inflight_1f1b(1, 5) == 1  # eq. M1: min(P - j, M)
    assert [pipeline.inflight("1f1b", j, 4, 8) for j in range(4)] == [4.0, 3.0, 2.0, 1.0]
    assert pipeline.inflight("1f1b", 0, 4, 2) == 2.0
    assert pipeline.inflight("gpipe", 3, 4, 8) == 8.0
    # interleaved, P = 4, vpp = 2, stage 0: ((4-0-1)*2 + (2-1)*4 + 1) / 2 = 11/2
    assert pipeline.inflight("interleaved", 0, 4, 100, vpp=2) == 5.5
    assert pipeline.inflight("interleaved", 0, 4, 3, vpp=2) == 3.0  # capped at M
    assert pipeline.inflight("interleaved", 1, 4, 100, vpp=1) == 3.0  # vpp = 1 is 1F1B


def test_steady_period_and_exposed_sync():
    # link term: max c / 2 = 1.5 beats the stages; no round trip binds at M = 1
    assert pipeline.steady_period([1.0, 1.0], [3.0], 1) == 1.5
    # round trip at stage 0: (1 + 1 + 2) / 2 = 2 > max(1, 2/2); GPipe has no round-trip term
    assert pipeline.steady_period([1.0, 1.0], [2.0], 4) == 2.0
    assert pipeline.steady_period([1.0, 1.0], [2.0], 4, "gpipe") == 1.0
    # stage 1's sync starts 2/3 * t_0 earlier: max(0.1, 1.0 - 2/3) = 1/3; a large s_0 wins
    assert pipeline.exposed_sync([1.0, 1.0], [0.1, 1.0]) == pytest.approx(1 / 3, rel=1e-15)
    assert pipeline.exposed_sync([1.0, 1.0], [0.5, 1.0]) == 0.5
    assert pipeline.exposed_sync([3.0, 1.0], [0.0, 1.0], bwd_share=0.25) == 0.25


def interleaved_windows_sliced(t, c, cw, m, v):
    """Eq. I7's windows by slicing: (mean, j, k) for ranks j..k (j < k) and, through the wrap, j..P-1 then 0..k
    (k < j), where the window's ranks have a steady phase (eq. I4: N < M vpp; through the wrap rank 0's)."""
    p = len(t)
    steady = [min((p - j - 1) * 2 + (v - 1) * p + 1, m * v) < m * v for j in range(p)]
    for j in range(p):
        for k in range(j + 1, p):
            if steady[j]:
                yield (sum(t[j:k + 1]) + v * sum(c[j:k])) / (2 * (k - j) + 1), j, k
        for k in range(j if steady[0] else 0):
            n = p - j + k
            yield (sum(t[j:]) + sum(t[:k + 1]) + v * (sum(c[j:]) + sum(c[:k])) + (v - 1) * cw) / (2 * n + 1), j, k


def test_interleaved_period_is_eq_i2_rank_by_rank_and_eq_i7_by_window():
    """Eq. I2 with each rank's R_j summed from scratch (eq. I3, as written in pipeline.interleaved_round_trip's
    docstring) and eq. I7's windows summed by slicing, against the running sums ``interleaved_period`` keeps; random
    stages, links (some as slow as a stage, where the windows bind), M and vpp."""
    rng = np.random.default_rng(7)
    binds = 0
    for _ in range(300):
        p, v, m = int(rng.integers(1, 12)), int(rng.integers(2, 6)), int(rng.integers(1, 40))
        t, cw = rng.uniform(0.001, 0.1, p).tolist(), float(rng.uniform(0, .02))
        c = rng.uniform(0.0, rng.choice([0.02, 0.1]), p - 1).tolist()
        want = max(max(t), v * max(c, default=0.0) / 2, (v - 1) * cw / 2)
        for j in range(p):
            r = ((v + 1) / 2 * sum(t[j:]) + (v - 1) / 2 * sum(t[:j]) + v * (v + 1) / 2 * sum(c[j:])
                 + v * (v - 1) / 2 * (sum(c[:j]) + cw))
            want = max(want, r / min((p - j - 1) * 2 + (v - 1) * p + 1, m * v))
        win = max((w for w, _, _ in interleaved_windows_sliced(t, c, cw, m, v)), default=0.0)
        binds += win > want * (1 + 1e-9)
        assert pipeline.interleaved_period(t, c, m, v, cw) == pytest.approx(max(want, win), rel=1e-12)
    assert binds >= 30, binds


def test_iteration_time_hand_values():
    # eq. T1: (4 - 1) * 2 + (1 + 1) + 2 + 1/3
    got = pipeline.iteration_time([1.0, 1.0], [2.0], [0.1, 1.0], 4)
    assert got == pytest.approx(10 + 1 / 3, rel=1e-15)
    assert pipeline.iteration_time([2.0], [], [], 3) == 6.0  # one stage, no sync: M * t
    # interleaved, vpp = 2 (eq. I1): tau = max(1, 2*0.25/2, 0.25/2, R_0/N_0 = 4/5, R_1/N_1 = 2.5/3) = 1;
    # (4 - 1/2) * 1 + 2/2 + 2 * 0.25 + 1 * 0.25 + 0
    assert pipeline.iteration_time([1.0, 1.0], [0.25], [0.0, 0.0], 4, "interleaved", 2, 0.25) == 5.25
    assert pipeline.compose_iteration_time(3, 2.0, 5.0, 1.0, 0.5) == 10.5
    arr = pipeline.compose_iteration_time(3, np.array([1.0, 2.0]), np.array([5.0, 5.0]), 1.0, 0.0)
    assert arr.tolist() == [8.0, 10.0]


def test_stage_memory_and_fit():
    # 10 + 4 * (2 + 2 * 3) = 42; + (5 + 2 * 1) = 49; + (7 + 2 * 0.5) = 57
    assert pipeline.stage_memory(10.0, 2.0, 3.0, 4, 2) == 42.0
    assert pipeline.stage_memory(10.0, 2.0, 3.0, 4, 2, first=(5.0, 1.0)) == 49.0
    assert pipeline.stage_memory(10.0, 2.0, 3.0, 4, 2, first=(5.0, 1.0), last=(7.0, 0.5)) == 57.0
    # the masked numpy form (brute force) gives the same bits as the scalar form, column by column
    rng = np.random.default_rng(0)
    fixed, st, act, fs, fa = rng.uniform(1e8, 1e10, (5, 3))
    n, a = np.array([3.0, 5.0, 7.0]), np.array([3.0, 2.0, 1.0])
    first = np.array([True, False, False])
    vec = pipeline.stage_memory(fixed, st, act, n, a, (first * fs, first * fa))
    for j in range(3):
        one = pipeline.stage_memory(fixed[j], st[j], act[j], n[j], a[j], (fs[j], fa[j]) if j == 0 else None)
        assert vec[j] == one
    assert pipeline.fits_memory(1.0 + 1e-10, 1.0) and not pipeline.fits_memory(1.0 + 1e-8, 1.0)
    assert pipeline.GIB == 1024**3


def test_backward_share():
    assert pipeline.bwd_share("none") == pipeline.bwd_share("selective") == pipeline.BWD_SHARE == 2 / 3
    assert pipeline.bwd_share("full") == 0.75


def test_parallel_rules():
    assert tp_head_misfits(32, 8, 4) == [] and tp_head_misfits(32, 8, 16) == ["kv_heads"]
    assert tp_head_misfits(12, 12, 8) == ["heads", "kv_heads"]
    assert tp_allowed(32, 8, 8, 8) and not tp_allowed(32, 8, 8, 4) and not tp_allowed(32, 8, 16, 16)
    assert ep_fits_grid(2, 4, 1, 8) and not ep_fits_grid(2, 2, 1, 8) and ep_fits_grid(2, 2, 2, 4, 2)


@pytest.fixture(scope="module")
def dp_outcome():
    model, cl = load_model("llama3-8b"), load_cluster("h100-80g:8,a100-80g:8")
    training = TrainingSpec(global_batch_size=64, seq_len=2048)
    ctx = planner.Context.build(model, cl, training, SolveOptions(max_stages=6))
    raw, _ = planner.run_method(ctx, "dp")
    return ctx, raw, planner.finish(ctx, raw)


def test_objective_and_estimate_share_the_closed_form(dp_outcome):
    ctx, raw, out = dp_outcome
    problem, a = ctx.presolved.problem, raw.assignment
    assert len(a.stages) > 1  # boundaries and syncs matter
    m = problem.variants[a.variant].num_microbatches
    t, c, s = stage_times(problem, a), boundary_times(problem, a), sync_times(problem, a)
    assert evaluate(problem, a) == pipeline.iteration_time(t, c, s, m) == raw.objective_s
    est = out.estimate
    et = [x.time_s for x in est.stages]
    es = [x.breakdown["sync_s"] for x in est.stages]
    assert est.iteration_time_s == pipeline.iteration_time(et, est.boundary_s, es, m)
    # the estimator prices the same stages as presolve; only the summation order of t_j differs
    assert est.iteration_time_s == pytest.approx(evaluate(problem, a), rel=1e-9)
    assert est.boundary_s == pytest.approx(c, rel=1e-12)
    mem = stage_memory(problem, a)
    assert [x.memory_gib * pipeline.GIB for x in est.stages] == pytest.approx(mem, rel=1e-9)


def test_simulator_reads_the_estimate_boundaries(dp_outcome):
    ctx, _raw, out = dp_outcome
    t, c, s, wrap = plan_timings(out.result.plan, ctx.estimator)
    assert c == out.estimate.boundary_s and wrap == out.estimate.wrap_boundary_s and wrap > 0
    assert closed_form_iteration_s(t, c, s, out.result.plan.num_microbatches) == out.estimate.iteration_time_s
