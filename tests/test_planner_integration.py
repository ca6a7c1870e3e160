"""End to end on real catalog inputs: presolve -> every method -> decode -> estimator, checker, simulator.

The promises checked here (issue 4 "Done when"): each solver's objective equals the estimator's
iteration time of the decoded plan (0.1%); the plan passes the independent checker; no group's
GPUs are over-used; same input -> same plan; the exact solvers agree with each other and with brute
force on a tiny real instance; DP is never better than the exact optimum.
"""

from __future__ import annotations

import pytest

from haap_milp import planner, simulate
from haap_milp.catalog import load_cluster, load_model
from haap_milp.problem import evaluate, violations
from haap_milp.specs import SolveOptions, Status, TrainingSpec

CASES = {
    # small enough for 2 CI cores, heterogeneous in type, memory and island
    "h100+a100": ("llama3-8b", "h100-80g:8,a100-80g:8", TrainingSpec(global_batch_size=64, seq_len=2048)),
    "80g+40g": ("gpt3-2.7b", "a100-80g:8,a100-40g:8", TrainingSpec(global_batch_size=32, seq_len=2048)),
    "islands": ("gpt3-1.3b", "a100-80g:8@ib,v100-32g:8@roce", TrainingSpec(global_batch_size=32, precision="fp16",
                                                                         seq_len=2048)),
    "moe": ("mixtral-8x7b", "h100-80g:16,a100-80g:16", TrainingSpec(global_batch_size=64, seq_len=2048)),
}
OPTS = SolveOptions(time_limit_s=20, threads=2, relative_gap=1e-4, max_stages=6)
# the small cases prove optimality in a few seconds; the limit is generous so a loaded machine does not
# turn a proof into a time-out. The MoE case does not prove within any reasonable limit (see below).
LIMITS = {"moe": 10.0}


@pytest.fixture(scope="module", params=sorted(CASES))
def compared(request):
    name, cluster, training = CASES[request.param]
    model, cl = load_model(name), load_cluster(cluster)
    opts = OPTS.model_copy(update={"time_limit_s": LIMITS.get(request.param, 60.0)})
    return request.param, model, cl, training, planner.compare(model, cl, training, opts)


def test_every_plan_is_valid_and_scored_consistently(compared):
    case, model, cluster, _, outs = compared
    for method, out in outs.items():
        r = out.result
        assert r.status in (Status.OPTIMAL, Status.FEASIBLE), (case, method, r.status, r.message)
        assert out.violations == [], (case, method, out.violations)
        assert abs(out.estimate.iteration_time_s - r.objective_s) <= 1e-3 * r.objective_s, (case, method)
        used: dict[tuple[str, str], int] = {}
        for s in r.plan.stages:  # a mixed stage (formulations/ eq. H1) uses each replica type's GPUs
            for g, isl, n in [(x.gpu_type, x.island, x.tp * x.count) for x in s.replicas] or \
                    [(s.gpu_type, s.island, s.num_gpus)]:
                used[(g, isl)] = used.get((g, isl), 0) + n
        for ng_key, n in used.items():
            have = sum(g.num_gpus for g in cluster.node_groups if (g.gpu.name, g.island) == ng_key)
            assert n <= have, (case, method, ng_key, n, have)
        assert sum(s.num_layers for s in r.plan.stages) == model.num_layers


def test_exact_solvers_agree_and_beat_heuristics(compared):
    case, _, _, _, outs = compared
    cp, milp = outs["cpsat"].result, outs["milp"].result
    tol = 2e-4 + float(cp.stats.get("tolerance_s", 0.0)) / cp.objective_s
    # each solver's proven bound is below the other's plan (they solve the same model)
    assert cp.bound_s <= milp.objective_s * (1 + tol) and milp.bound_s <= cp.objective_s * (1 + tol), case
    best = min(cp.objective_s, milp.objective_s)
    for heuristic in ("dp", "uniform"):  # the exact solvers start from DP: never worse than it
        assert outs[heuristic].result.objective_s >= min(cp.bound_s, milp.bound_s) * (1 - tol), (case, heuristic)
    assert best <= outs["dp"].result.objective_s * (1 + tol), case
    if case == "moe":
        return  # 32 GPUs x 8 experts: the limit ends with a proven gap of ~7 % (README: where haap falls short)
    assert cp.status == Status.OPTIMAL and milp.status == Status.OPTIMAL, (case, cp.message, milp.message)
    # both proven optimal to 1e-4 (CP-SAT within its stated rounding error): same optimum
    assert abs(cp.objective_s - milp.objective_s) <= tol * milp.objective_s, case


def test_simulator_agrees_with_objective(compared):
    """The event-by-event replay and the closed form the solvers optimise (eqs. T1-T3) agree."""
    case, _, _, _, outs = compared
    for method, out in outs.items():
        sim = simulate.simulate_plan(out.result.plan, out.estimator)
        rel = (sim.iteration_time_s - out.result.objective_s) / out.result.objective_s
        # the closed form bounds the replay from above up to a few % on heterogeneous pipelines
        # (benchmarks/results/sim_vs_closed_form.md); these plans sit within 1.1 % (moe, after the issue-12 third refit)
        assert abs(rel) <= 0.015, (case, method, sim.iteration_time_s, out.result.objective_s)


def test_same_input_same_plan():
    name, cluster, training = CASES["80g+40g"]
    model, cl = load_model(name), load_cluster(cluster)
    a = planner.solve(model, cl, training, OPTS).result
    b = planner.solve(model, cl, training, OPTS).result
    assert a.plan == b.plan and a.objective_s == b.objective_s


def test_brute_force_on_a_tiny_real_instance():
    model, cl = load_model("gpt3-125m"), load_cluster("a100-80g:2/2,a100-40g:2/2")
    training = TrainingSpec(global_batch_size=8, seq_len=1024)
    opts = SolveOptions(time_limit_s=20, relative_gap=0.0, max_stages=3, micro_batch_sizes=(2, 4))
    ctx = planner.Context.build(model, cl, training, opts)
    brute, _ = planner.run_method(ctx, "brute")
    for method in ("cpsat", "milp"):
        raw, _ = planner.run_method(ctx, method)
        assert raw.status == "OPTIMAL"
        assert violations(ctx.presolved.problem, raw.assignment) == []
        assert evaluate(ctx.presolved.problem, raw.assignment) == pytest.approx(brute.objective_s, rel=1e-4)


def test_infeasible_problem_names_the_binding_limit():
    model, cl = load_model("llama3-405b"), load_cluster("a100-40g:8")
    out = planner.solve(model, cl, TrainingSpec(global_batch_size=8), OPTS)
    assert out.result.status == Status.INFEASIBLE
    msg = out.result.message
    assert "memory" in msg and ("GiB" in msg or "GPUs" in msg), msg


def test_uniform_target_yields_uniform_plan():
    name, cluster, training = CASES["h100+a100"]
    opts = OPTS.model_copy(update={"target": "megatron"})
    out = planner.solve(load_model(name), load_cluster(cluster), training, opts)
    assert out.result.plan is not None and out.result.plan.is_uniform


@pytest.mark.parametrize("target", ["megatron", "flagscale", "torchtitan"])
def test_target_plans_are_accepted_by_their_emitter(target):
    """--target is a constraint of the search: the plan it returns is one the engine can run."""
    from haap_milp.emit import emit

    # torchtitan builds only its registry models (llama3 8B here); the others run the GPT-style case
    name, cluster, training = CASES["h100+a100" if target == "torchtitan" else "80g+40g"]
    model, cl = load_model(name), load_cluster(cluster)
    out = planner.solve(model, cl, training, OPTS.model_copy(update={"target": target}))
    assert out.result.plan is not None and out.violations == []
    files = emit(out.result.plan, target, cl, model, training)
    assert files and all(text.strip() for text in files.values())


def test_uniform_target_constrains_expert_parallelism():
    """Megatron-LM runs one ep on every stage: a MoE plan for it has the same ep everywhere and is emitted."""
    from haap_milp.emit import emit

    name, cluster, training = CASES["moe"]
    model, cl = load_model(name), load_cluster(cluster)
    out = planner.solve(model, cl, training, OPTS.model_copy(update={"target": "megatron", "time_limit_s": 10.0}))
    plan = out.result.plan
    assert plan is not None and out.violations == [], out.result.message
    assert len({(s.ep, s.etp) for s in plan.stages}) == 1 and plan.is_uniform
    assert "megatron_args.sh" in emit(plan, "megatron", cl, model, training)


def test_milp_after_cpsat_in_one_process():
    """HiGHS's global thread pool, once sized by an earlier run, made every later MILP run return
    "Not Set" at once (seen in the bench: CP-SAT's node LPs, then MILP with another thread count)."""
    model, cl = load_model("gpt3-1.3b"), load_cluster("h100-80g:16")
    opts = SolveOptions(threads=1, relative_gap=0.01, time_limit_s=20)
    ctx = planner.Context.build(model, cl, TrainingSpec(global_batch_size=512, seq_len=4096), opts)
    warm, _ = planner.run_method(ctx, "dp")
    for method in ("cpsat", "milp", "cpsat", "milp"):
        raw, _ = planner.run_method(ctx, method, warm)
        assert raw.status == "OPTIMAL", (method, raw.message[:200])
