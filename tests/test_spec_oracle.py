"""The user path ``planner.solve`` against the spec-level brute-force oracle (tests/spec_oracle.py).

The oracle enumerates Plans from the specs alone, scores them with the estimator and keeps those
check_plan accepts, so these tests check presolve (enumeration, memory and dominance pruning, the
eq. B1 variant pruning), the solvers and decode together, independently of the Problem they build.
Exact methods must reach the oracle optimum (within the requested gap); heuristics must return a
valid plan never better than it. A presolve that prunes the optimal option, or a decode that maps an
option to the wrong stage configuration, makes an exact method miss the oracle."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from spec_oracle import TINY_MODEL, TINY_TRAINING, first_valid, score_plans, stage_configs, tiny_cluster

from haap_milp import planner
from haap_milp.check import check_plan
from haap_milp.estimator import Estimator
from haap_milp.solvers import SOLVERS
from haap_milp.specs import SolveOptions, Status, TrainingSpec

MODEL = TINY_MODEL
EXACT = ("cpsat", "milp", "brute")
HEURISTIC = ("dp", "uniform")
LONG = TrainingSpec(global_batch_size=4, seq_len=8192)  # activation-heavy: recompute pays off
_opts = SolveOptions(max_stages=3, relative_gap=0.0, threads=1, recompute=("none", "full"))

# name -> (cluster, training, options); every case is memory-bound (cheaper plans fail check_plan's memory rule)
CASES = {
    "long-seq-recompute": (tiny_cluster(8, 6), LONG, _opts.model_copy(update={"recompute": ("none", "selective",
                                                                                             "full")})),
    "two-islands": (tiny_cluster(9, 6, 5.0), TINY_TRAINING, _opts),
    "two-islands-megatron": (tiny_cluster(9, 6, 5.0), TINY_TRAINING, _opts.model_copy(update={"target": "megatron"})),
    "infeasible": (tiny_cluster(6, 4), TINY_TRAINING, _opts),
    # eq. Z1: every ZeRO stage per stage (the oracle enumerates 0-3 and lets check_plan drop what cannot run)
    "zero-auto-fsdp": (tiny_cluster(7, 5), TrainingSpec(global_batch_size=4, seq_len=1024, engine="fsdp"),
                       _opts.model_copy(update={"zero": "auto", "max_stages": 2})),
}
_SCORED: dict = {}


def _scored(cluster, training, options):
    """Scored plans, shared by cases with the same specs and search space (the target applies later)."""
    key = (cluster.name, training.seq_len, training.engine, options.max_stages, options.recompute, options.zero)
    if key not in _SCORED:
        est = Estimator(MODEL, cluster, training)
        _SCORED[key] = (est, score_plans(MODEL, cluster, training, options, est))
    return _SCORED[key]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    cluster, training, options = CASES[request.param]
    est, scored = _scored(cluster, training, options)
    oracle = first_valid(scored, MODEL, cluster, training, options.target, est)
    return request.param, cluster, training, options, oracle


def test_oracle_cases_are_what_they_claim(case):
    name, _cluster, _training, options, oracle = case
    if name == "infeasible":
        assert oracle.plan is None and oracle.plans_scored > 0
        return
    assert oracle.plan is not None
    assert oracle.plans_checked > 1, "memory (or the target's rules) must reject a cheaper plan"
    assert len({s.gpu_type for s in oracle.plan.stages}) == 2, "the optimum should use both GPU types"
    if options.target == "megatron":
        assert oracle.plan.is_uniform
    if name == "long-seq-recompute":  # a presolve that lost recompute options would miss this optimum
        assert any(s.recompute != "none" for s in oracle.plan.stages)


@pytest.mark.parametrize("method", sorted(SOLVERS))
def test_user_path_against_the_oracle(case, method):
    _name, cluster, training, options, oracle = case
    out = planner.solve(MODEL, cluster, training, options.model_copy(update={"solver": method}))
    res = out.result
    if oracle.plan is None:
        assert res.status in (Status.INFEASIBLE, Status.NO_SOLUTION) and res.plan is None, (method, res.status)
        return
    assert res.plan is not None, (method, res.status, res.message)
    assert out.violations == []
    assert check_plan(res.plan, MODEL, cluster, training, target=options.target) == []
    got = out.estimate.iteration_time_s
    assert res.objective_s == pytest.approx(got, rel=1e-6)  # solver objective = estimator re-score
    assert got >= oracle.time_s * (1 - 1e-9), "better than exhaustive enumeration: the oracle missed a plan"
    if method in EXACT:
        assert res.status == Status.OPTIMAL, (method, res.message)
        tol = float(res.stats.get("tolerance_s", 0.0)) + 1e-6 * oracle.time_s
        assert got <= oracle.time_s * (1 + options.relative_gap) + tol, (method, res.plan, oracle.plan)
    else:
        assert res.status == Status.FEASIBLE
    if method == "uniform":  # no better than the best uniform plan of the enumeration
        est, scored = _scored(cluster, training, options)
        uni = first_valid(scored, MODEL, cluster, training, options.target, est, accept=lambda p: p.is_uniform)
        assert res.plan.is_uniform
        assert got >= uni.time_s * (1 - 1e-9)


def test_stage_configs_follow_the_rules():
    cluster = tiny_cluster(10, 7)
    cfgs = stage_configs(MODEL, cluster, 4, ("none",))
    assert {(tp, dp) for _, _, tp, dp, *_ in cfgs} == {(1, 1), (1, 2), (2, 1)}  # tp*dp <= 2 GPUs, dp | 4
    assert {(tp, dp) for _, _, tp, dp, *_ in stage_configs(MODEL, cluster, 1, ("none",))} == {(1, 1), (2, 1)}


def test_compare_against_the_oracle():
    """planner.compare (every method on one shared presolve) agrees with the oracle too."""
    cluster, training, options = CASES["two-islands"]
    est, scored = _scored(cluster, training, options)
    oracle = first_valid(scored, MODEL, cluster, training, options.target, est)
    outs = planner.compare(MODEL, cluster, training, options)
    assert set(outs) == {"cpsat", "milp", "dp", "uniform"}
    for method, out in outs.items():
        assert out.violations == [] and out.result.plan is not None, method
        got = out.estimate.iteration_time_s
        assert got >= oracle.time_s * (1 - 1e-9), method
        if method in EXACT:
            assert got <= oracle.time_s * (1 + 1e-6) + float(out.result.stats.get("tolerance_s", 0.0)), method
