"""Mixed stages (formulations/ eqs. H1-H7): a stage's data-parallel replicas of two GPU types.

The user path (presolve's bounded enumeration, the solvers' usage rows, decode, the estimator's re-score) is
compared with the spec-level oracle (tests/spec_oracle.py), which enumerates mixed stages from the specs
alone with every integer split of the micro-batch. Then the judges: check.py from the specs, the simulator,
plan files, the engines' refusals and the CLI flag."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from conftest import invoke_cli
from spec_oracle import best_plan, tiny_cluster

from haap_milp import planner, presolve
from haap_milp.check import check_plan
from haap_milp.emit import emit
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator
from haap_milp.planfile import read_plan_file
from haap_milp.problem import Assignment, Option, Replicas, Stage, violations
from haap_milp.simulate import closed_form_iteration_s, plan_timings, simulate_plan
from haap_milp.solvers.brute import solve as brute
from haap_milp.solvers.common.bounds import variant_bound
from haap_milp.solvers.common.slot_bounds import build_tables
from haap_milp.specs import ModelSpec, Replica, SolveOptions, StagePlan, Status, TrainingSpec
from haap_milp.targets import EmitError

# two decoder layers: too few to balance a pipeline of an A100 pair and an H100 pair, so one stage on both
# types, the H100s taking more of each micro-batch, beats every single-type plan (the case of issue #15)
MODEL = ModelSpec(name="tiny-2l", num_layers=2, hidden=4096, ffn_hidden=16384, num_heads=16, vocab_size=32000)
OPTS = SolveOptions(max_stages=2, relative_gap=0.0, threads=1, recompute=("none", "full"))
CASES = {  # name -> (cluster, training): memory-bound (cheaper plans fail the memory check) and roomy
    "memory-bound": (tiny_cluster(12, 12), TrainingSpec(global_batch_size=16, seq_len=4096)),
    "roomy": (tiny_cluster(80, 80), TrainingSpec(global_batch_size=24, seq_len=4096)),  # gbs 12: no mixed optimum since the issue-12 second refit
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    cluster, training = CASES[request.param]
    est = Estimator(MODEL, cluster, training)
    on = best_plan(MODEL, cluster, training, OPTS, est)
    off = best_plan(MODEL, cluster, training, OPTS.model_copy(update={"mixed_stages": "off"}), est)
    return request.param, cluster, training, est, on, off


def test_the_oracle_optimum_is_mixed_and_pays(case):
    name, *_, on, off = case
    assert on.plan is not None and on.plan.has_mixed_stage, on.plan
    assert on.time_s < off.time_s * 0.95, (on.time_s, off.time_s)  # >= 5 % over the search without them
    if name == "memory-bound":
        assert on.plans_checked > 1, "memory must reject a cheaper plan here"
    fast = max(on.plan.stages[0].replicas, key=lambda r: r.micro_batch)
    assert fast.gpu_type == "h100-80g"  # the faster type takes more of each micro-batch (eq. H2)


@pytest.mark.parametrize("method", ["cpsat", "milp", "brute", "dp"])
def test_user_path_reaches_the_mixed_oracle(case, method):
    _name, cluster, training, _est, on, _off = case
    out = planner.solve(MODEL, cluster, training, OPTS.model_copy(update={"solver": method}))
    res = out.result
    assert res.plan is not None and out.violations == []
    got = out.estimate.iteration_time_s
    assert res.objective_s == pytest.approx(got, rel=1e-6)  # solver objective = estimator re-score (eqs. H3-H6)
    assert got >= on.time_s * (1 - 1e-9), "better than exhaustive enumeration: the oracle missed a plan"
    if method != "dp":
        assert res.status == Status.OPTIMAL
        assert got <= on.time_s * (1 + 1e-6) + float(res.stats.get("tolerance_s", 0.0)), (res.plan, on.plan)
        assert res.bound_s <= got * (1 + 1e-9)


def test_lower_bounds_hold_with_mixed_options(case):
    """Eq. B2 (knapsack counting a mixed option in each of its groups, components joined by it) never
    exceeds a variant's exhaustive optimum."""
    _name, cluster, training, est, *_ = case
    prob = presolve.build(MODEL, cluster, training, OPTS, est).problem
    assert any(o.mix for o in prob.options)
    for v in range(len(prob.variants)):
        only = type(prob)(**{**prob.__dict__, "variants": (prob.variants[v],)})
        exact = brute(only)
        bound = variant_bound(only, build_tables(only, 0)).total_s
        if exact.status == "OPTIMAL":
            assert bound <= exact.objective_s * (1 + 1e-9), v
        else:
            assert exact.status == "INFEASIBLE"


def test_g1_counts_every_group_of_a_mixed_option():
    mixed = Option(group=0, tp=1, dp=3, ep=1, recompute="none",
                   mix=(Replicas(0, 1, 1, 2), Replicas(1, 2, 2, 3)), link=2)
    assert mixed.usage == ((0, 1), (1, 4)) and mixed.num_gpus == 5 and mixed.endpoint == 2
    single = Option(group=1, tp=1, dp=1, ep=1, recompute="none")
    from dataclasses import replace

    import haap_milp.problem as pb

    var = pb.Variant(8, 1, *(np.ones(2) for _ in range(15)), p2p_time=np.zeros((3, 3)), allowed=np.ones(2, bool))
    var = replace(var, mem_capacity=np.full(2, 1e12))
    prob = pb.Problem(num_layers=2, max_stages=2, groups=("a", "b"), group_capacity=(1, 4), options=(mixed, single),
                      variants=(var,))
    assert violations(prob, Assignment(0, (Stage(0, 2),))) == []
    assert violations(prob, Assignment(0, (Stage(0, 1), Stage(1, 1)))) == ["group b uses 5 GPUs of 4"]


def _mixed_plan(case):
    return case[4].plan


def test_checker_judges_mixed_stages_from_the_specs(case):
    _name, cluster, training, est, on, _off = case
    plan = on.plan
    assert check_plan(plan, MODEL, cluster, training, estimator=est) == []
    j = next(i for i, s in enumerate(plan.stages) if s.replicas)
    st = plan.stages[j]
    r0, r1 = st.replicas
    # a mixed later stage must run the B samples the first stage sets: 1 x 2 + 2 x 2 = 6, B = 4 x 1
    first = StagePlan(first_layer=0, num_layers=1, gpu_type="a100-80g", tp=1, dp=1)
    later = StagePlan(first_layer=1, num_layers=1, gpu_type="a100-80g", tp=1, dp=3, replicas=(
        Replica(gpu_type="a100-80g", tp=1, count=1, micro_batch=2),
        Replica(gpu_type="h100-80g", tp=1, count=2, micro_batch=2)))
    bad_split = plan.model_copy(update={"stages": (first, later), "micro_batch_size": 4,
                                        "num_microbatches": training.global_batch_size // 4})
    rules = [v.rule for v in check_plan(bad_split, MODEL, cluster, training, estimator=est)]
    assert rules == ["batch.mixed_split"]
    over = st.model_copy(update={"replicas": (r0, r1.model_copy(update={"count": r1.count + 2})),
                                 "dp": st.dp + 2})
    rules = {v.rule for v in check_plan(plan.model_copy(update={"stages": tuple(
        over if i == j else s for i, s in enumerate(plan.stages))}), MODEL, cluster, training, estimator=est)}
    assert "gpus.per_type" in rules
    # each replica type against its own memory: shrink only the H100s
    small = tiny_cluster(cluster.gpu("a100-80g").memory_gib, 3)
    viol = check_plan(plan, MODEL, small, training)
    assert [v.rule for v in viol] == ["memory.capacity"] and "h100-80g" in viol[0].message
    assert [v.rule for v in check_plan(plan, MODEL, cluster, training, target="flagscale", estimator=est)
            ][-1] == "flagscale.mixed_stage"


@pytest.mark.parametrize("target", ["flagscale", "megatron", "torchtitan"])
def test_engines_refuse_mixed_stages_with_the_reason(case, target):
    _name, cluster, training, *_ = case
    with pytest.raises(EmitError, match="differ in GPU type"):
        emit(_mixed_plan(case), target, cluster, MODEL, training)


def test_simulator_and_plan_file_replay_a_mixed_plan(case, tmp_path):
    _name, _cluster, training, est, on, _off = case
    plan = on.plan
    sim = simulate_plan(plan, est)
    t, c, s, _ = plan_timings(plan, est)
    assert closed_form_iteration_s(t, c, s, plan.num_microbatches) == pytest.approx(on.time_s, rel=1e-12)
    assert sim.closed_form_s == pytest.approx(on.time_s, rel=1e-9)
    assert sim.iteration_time_s == pytest.approx(on.time_s, rel=2e-2)  # the event replay of the same stages
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"plan": plan.model_dump(mode="json")}))
    back = read_plan_file(path).plan
    assert back == plan and back.samples_per_microbatch == training.global_batch_size // plan.num_microbatches
    single = json.loads(plan.model_copy(update={"stages": (plan.stages[0].model_copy(
        update={"replicas": (), "dp": 1}),)}).model_dump_json())
    assert "replicas" not in single["stages"][0]  # single-type stages are written as before


def test_presolve_flag_and_targets():
    cluster, training = CASES["roomy"]
    off = presolve.build(MODEL, cluster, training, OPTS.model_copy(update={"mixed_stages": "off"}))
    assert not any(o.mix for o in off.problem.options) and off.stats["mixed_options"] == 0
    for target in ("megatron", "flagscale"):  # auto: off where the engine cannot run them
        pre = presolve.build(MODEL, cluster, training, OPTS.model_copy(update={"target": target}))
        assert not any(o.mix for o in pre.problem.options), target
    with pytest.raises(HaapInputError, match="--mixed-stages on"):
        presolve.build(MODEL, cluster, training, OPTS.model_copy(update={"target": "megatron", "mixed_stages": "on"}))
    # --uniform dp keeps them (a mixed stage's dp is its replica count, eq. H1); --uniform tp rules them out
    same_dp = presolve.build(MODEL, cluster, training.model_copy(update={"uniform": ("dp",)}), OPTS).problem
    mixed = [o for o in same_dp.options if o.mix]
    assert mixed and same_dp.uniform and all(o.signature == (sum(r.count for r in o.mix),) for o in mixed)
    same_tp = presolve.build(MODEL, cluster, training.model_copy(update={"uniform": ("tp",)}), OPTS).problem
    assert not any(o.mix for o in same_tp.options)


@pytest.mark.parametrize("args", [["--mixed-stages", "on", "--target", "megatron"], ["--mixed-stages", "maybe"]])
def test_cli_mixed_stages_flag_errors_are_one_paragraph(args):
    code, _out, err = invoke_cli(["solve", "-m", "gpt3-1.3b", "-c", "h100-80g:8,a100-80g:8", "--time-limit", "5",
                                  *args])
    assert code == 2 and "--mixed-stages" in err and "Traceback" not in err


def test_sync_across_types_uses_the_measured_cross_type_link(tmp_path):
    """Eq. H4: with Sailor's measured network (A100-40 -> V100-16 slower than between A100 VMs) the A100
    replicas' gradient ring, which crosses to the V100 nodes, is priced on the slower link; without a
    cross_type figure (datasheet network) each type keeps its own links."""
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.estimator import mixed
    from haap_milp.network.merge import apply_network_option

    src = pathlib.Path(__file__).parent / "data" / "sailor_network" / "multizone_bandwidths_het.json"
    code, _, err = invoke_cli(["network", "import", "--format", "sailor", str(src), "--zone", "us-central1-a", "-o",
                               str(tmp_path / "net.yaml")])
    assert code == 0, err
    model, base = load_model("opt-350m"), load_cluster("a100-40g:32/4,v100-16g:96/4")
    training = TrainingSpec(global_batch_size=1026, seq_len=2048, precision="fp32")
    keys = (("a100-40g", "main", 1, 3, 2), ("v100-16g", "main", 4, 24, 2))
    for cluster, crosses in ((base, False), (apply_network_option(base, str(tmp_path / "net.yaml")), True)):
        est = Estimator(model, cluster, training)
        own = [mixed.type_costs(est, k, 27, 1, "none") for k in keys]
        both = est.mixed_costs(keys, 1, "none").types
        for o, b in zip(own, both):
            assert b.layer.sync_s >= o.layer.sync_s and b.first.sync_s >= o.first.sync_s
        assert (both[0].layer.sync_s > own[0].layer.sync_s * 1.05) == crosses


def test_splits_are_every_integer_split_of_the_micro_batch():
    """The range of m_a (eq. H2) is exactly the m_a that brute force finds, ascending, for every small case; a fixed
    micro-batch allows only itself."""
    from haap_milp.mixed_stages import _splits
    for b in range(1, 97):
        for na in range(1, 13):
            for nb in range(1, 13):
                brute = [ma for ma in range(1, b + 1) if b - na * ma >= nb and (b - na * ma) % nb == 0]
                assert list(_splits(b, na, nb, None)) == brute, (b, na, nb)
                for fixed in (1, 2, 3):
                    assert list(_splits(b, na, nb, fixed)) == ([fixed] if (na + nb) * fixed == b else [])


def test_best_split_is_the_fastest_split_by_brute_force():
    """Eq. H3's bisection gives the split with the least slowest-type layer time among all splits, as pricing every
    split does (it relies on a type's layer time growing with its samples), with or without the shared memo."""
    from types import SimpleNamespace

    from haap_milp.mixed_stages import _best_split, _splits
    cluster, training = CASES["roomy"]
    est = Estimator(MODEL, cluster, training)
    A, B = (SimpleNamespace(gpu_type=g.gpu.name, island=g.island) for g in cluster.node_groups)
    memo: dict = {}
    checked = 0
    for b, na, nb, ta, tb in [(b, na, nb, ta, tb) for b in (7, 16, 24, 61) for na in (1, 2, 3) for nb in (1, 2, 5)
                              for ta in (1, 2) for tb in (1, 2)]:
        def t(g, tp, m):
            return est.layer_cost(g.gpu_type, tp, 1, 1, 1, "none", m, island=g.island).time_s
        splits = [(ma, (b - na * ma) // nb) for ma in _splits(b, na, nb, None)]
        got = _best_split(est, A, B, ta, tb, na, nb, "none", b, None, memo)
        if not splits:
            assert got is None
            continue
        best = min(max(t(A, ta, ma), t(B, tb, mb)) for ma, mb in splits)
        assert got is not None and got[0] == pytest.approx(best, rel=1e-12), (b, na, nb, ta, tb)
        assert got == _best_split(est, A, B, ta, tb, na, nb, "none", b, None)
        checked += 1
    assert checked > 100
