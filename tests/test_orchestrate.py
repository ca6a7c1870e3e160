"""planner.orchestrate, the one planning sequence (solve, compare and the benchmark call it): heuristics
first, the better warm-starts the exact methods, and with a step a failing run is that run's outcome."""

from __future__ import annotations

import pytest

from haap_milp import planner
from haap_milp.catalog import load_cluster, load_model
from haap_milp.methods import HEURISTICS
from haap_milp.planner import Outcome
from haap_milp.specs import SolveOptions, Status, TrainingSpec

TRAINING = TrainingSpec(global_batch_size=16, seq_len=2048)
OPTS = SolveOptions(time_limit_s=30, threads=1, relative_gap=0.0, max_stages=2, micro_batch_sizes=(4, 8))


@pytest.fixture(scope="module")
def ctx():
    return planner.Context.build(load_model("gpt3-1.3b"), load_cluster("a100-80g:4/4,a100-40g:4/4"), TRAINING, OPTS)


def _failing(name: str):
    calls = []

    def step(method, limit, fn, *args):
        calls.append((method, limit))
        if method == name:
            raise RuntimeError(f"{name} broke")
        return fn(*args)

    return step, calls


def test_heuristics_run_first_and_once(ctx):
    step, calls = _failing("none")
    seq = planner.orchestrate(ctx, [("cpsat", 5.0), ("uniform", None), ("cpsat", 10.0), ("dp", None)], step)
    assert calls == [(h, None) for h in HEURISTICS] + [("cpsat", 5.0), ("cpsat", 10.0)]
    assert all(isinstance(o, Outcome) for o in seq.outcomes)
    first, _, second, dp = (o.result for o in seq.outcomes)
    assert first.solver == second.solver == "cpsat" and dp.solver == "dp"
    assert first.status == second.status == Status.OPTIMAL
    assert first.stats["dp_objective_s"] == dp.objective_s  # the exact runs record what they started from


def test_a_failing_heuristic_is_its_runs_outcome_and_the_other_warm_starts(ctx):
    step, _ = _failing("dp")
    seq = planner.orchestrate(ctx, [("dp", None), ("uniform", None), ("milp", 10.0)], step)
    dp, uni, milp = seq.outcomes
    assert isinstance(dp, RuntimeError) and isinstance(uni, Outcome) and isinstance(milp, Outcome)
    assert milp.result.status == Status.OPTIMAL
    assert "dp_objective_s" not in milp.result.stats
    assert milp.result.stats["uniform_objective_s"] == uni.result.objective_s


def test_without_a_step_failures_propagate(ctx, monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("solver broke")

    monkeypatch.setattr(planner, "run_method", boom)
    with pytest.raises(RuntimeError, match="solver broke"):
        planner.orchestrate(ctx, [("dp", None)])
    step, _ = _failing("none")
    assert isinstance(planner.orchestrate(ctx, [("dp", None)], step).outcomes[0], RuntimeError)


def test_the_uniform_baseline_as_a_warm_start_candidate_only_gets_a_share_of_the_dps_time(ctx, monkeypatch):
    """Only where no run asks for it and the DP, run before it, has a plan: the uniform baseline's deadline is at most
    UNIFORM_SHARE of the DP's wall time from now (UNIFORM_MIN_S at least); else the heuristics' deadline as it is. In
    a solve it still runs and is recorded."""
    import time

    from haap_milp.deadline import Deadline, current
    from haap_milp.problem import RawResult

    dl = Deadline(60.0)
    plan = planner.run_method(ctx, "dp")[0]
    dp = RawResult("FEASIBLE", "dp", assignment=plan.assignment, objective_s=plan.objective_s, wall_time_s=4.0)
    capped = planner._heuristic_deadline(dl, {"dp": dp}, "uniform", {"cpsat"})
    left = capped.at - time.monotonic()
    assert max(planner.UNIFORM_MIN_S, planner.UNIFORM_SHARE * 4.0) - 0.05 < left <= planner.UNIFORM_SHARE * 4.0
    assert planner._heuristic_deadline(dl, {"dp": dp}, "uniform", {"cpsat", "uniform"}) is dl  # asked for
    assert planner._heuristic_deadline(dl, {"dp": dp}, "dp", {"cpsat"}) is dl
    none = RawResult("NO_SOLUTION", "dp", wall_time_s=4.0)
    assert planner._heuristic_deadline(dl, {"dp": none}, "uniform", {"cpsat"}) is dl  # no DP plan: not capped
    assert planner._heuristic_deadline(dl, {}, "uniform", {"cpsat"}) is dl
    seen = {}
    real = planner.run_method

    def spy(c, method, *a):
        seen[method] = current().at
        return real(c, method, *a)

    monkeypatch.setattr(planner, "run_method", spy)
    out = planner.orchestrate(ctx, [("cpsat", 10.0)], deadline=Deadline(60.0)).outcomes[0].result
    assert "uniform_objective_s" in out.stats and seen["uniform"] < seen["dp"] - 5  # (the DP: the heuristics' 20 s)
