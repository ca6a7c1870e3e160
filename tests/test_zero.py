"""The ZeRO stage as a per-stage search dimension (formulations/ eqs. Z1-Z5): memory and time coefficients,
presolve's search set per runtime and target, the CLI flag and its conflicts, the checker's rule, the emitters."""

from __future__ import annotations

import pytest

from haap_milp import planner, presolve
from haap_milp.catalog import load_cluster, load_model
from haap_milp.check import check_plan
from haap_milp.cli.estimate_cmd import uniform_plan
from haap_milp.cli.runtime_opts import zero_search
from haap_milp.emit import flagscale, megatron, torchtitan
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator
from haap_milp.estimator import zero as zmod
from haap_milp.simulate import simulate_plan
from haap_milp.specs import SolveOptions, TrainingSpec

M8 = load_model("llama3-8b")
C16 = load_cluster("a100-80g:16")
ARGS = ("a100-80g", 2, 8, 1, 1, "none", 8)


def test_memory_follows_the_stage_eq_z2():
    est = Estimator(M8, C16, TrainingSpec(seq_len=2048, engine="fsdp"))
    c = {z: est.layer_cost(*ARGS, zero=z) for z in (0, 1, 2, 3)}
    n = c[0].weights_bytes / 2  # parameters on the GPU (bf16 weights: 2 bytes)
    for z, (w, g, o) in {0: (2, 4, 12), 1: (2, 4, 12 / 8), 2: (2, 4 / 8, 12 / 8), 3: (2 / 8, 4 / 8, 12 / 8)}.items():
        assert (c[z].weights_bytes, c[z].grads_bytes, c[z].optimizer_bytes) == pytest.approx((w * n, g * n, o * n))
    # ZeRO-2/3 pay their per-micro-batch collectives in the layer time (eq. Z4), ZeRO-0/1 in the step's sync
    assert c[0].zero3_comm_s == c[1].zero3_comm_s == 0 and c[3].time_s >= c[2].time_s >= c[1].time_s - 1e-12
    assert est.stage_fixed_bytes("a100-80g", 2, dp=8, zero=3) > est.stage_fixed_bytes("a100-80g", 2, dp=8, zero=2)


def test_exposed_share_eq_z4():
    assert zmod.exposed_s(1.0, 2.0, 3.0, 1.5, True, True) == pytest.approx(0.5)
    assert zmod.exposed_s(1.0, 2.0, 3.0, 1.5, False, False) == pytest.approx(3.0)
    assert zmod.microbatch_comm_s(3, 1.0, 0.5) == (1.0, 1.5) and zmod.microbatch_comm_s(2, 1.0, 0.5) == (1.0, 0.5)


def test_explicit_runtime_stage_prices_as_the_runtime():
    est = Estimator(M8, C16, TrainingSpec(seq_len=2048))  # megatron: ZeRO-1
    assert est.layer_cost(*ARGS, zero=1) is est.layer_cost(*ARGS)  # one cache entry
    assert est.layer_cost(*ARGS, zero=0).sync_s != est.layer_cost(*ARGS).sync_s


@pytest.mark.parametrize(("engine", "target", "max_stages", "want"), [
    ("megatron", "any", None, {0, 1}), ("fsdp", "any", None, {0, 1, 2, 3}), ("deepspeed", "any", None, {0, 1}),
    ("fsdp", "torchtitan", None, {0, 1}), ("fsdp", "torchtitan", 1, {0, 2, 3}), ("fsdp", "flagscale", None, {None})])
def test_presolve_search_set_eq_z1(engine, target, max_stages, want):
    tr = TrainingSpec(global_batch_size=16, seq_len=2048, engine=engine)
    pre = presolve.build(M8, C16, tr, SolveOptions(zero="auto", target=target, max_stages=max_stages,
                                                   micro_batch_sizes=(8,)))
    assert {o.zero for o in pre.problem.options} == want


def test_solve_with_zero_auto_is_consistent_and_never_worse():
    tr = TrainingSpec(global_batch_size=32, seq_len=4096, engine="fsdp")
    opts = SolveOptions(time_limit_s=20, threads=1, relative_gap=0.0, max_stages=2, micro_batch_sizes=(8, 16))
    base = planner.solve(M8, C16, tr, opts)
    out = planner.solve(M8, C16, tr, opts.model_copy(update={"zero": "auto"}))
    assert out.violations == [] and all(s.zero is not None for s in out.result.plan.stages)
    assert out.result.objective_s == pytest.approx(out.estimate.iteration_time_s, rel=1e-6)
    assert out.result.objective_s <= base.result.objective_s * (1 + 1e-9)  # the runtime's stage is in the set
    sim = simulate_plan(out.result.plan, out.estimator)  # the simulator re-prices each stage's zero
    assert sim.closed_form_s == pytest.approx(out.result.objective_s, rel=1e-9)
    again = type(out.result.plan).model_validate_json(out.result.plan.model_dump_json())
    assert [s.zero for s in again.stages] == [s.zero for s in out.result.plan.stages]


def test_cli_flag_and_conflicts():
    assert zero_search(None) is None and zero_search("auto") == "auto" and zero_search("3,1") == (3, 1)
    assert zero_search("1", dist_opt=True) == (1,)
    for text, kw in (("3", {"dist_opt": False}), ("0", {"dist_opt": True}), ("auto", {"dist_opt": False}),
                     ("2", {"zero_stage": 3}), ("4", {}), ("x", {})):
        with pytest.raises(HaapInputError, match="--zero"):
            zero_search(text, **kw)
    tr = TrainingSpec(global_batch_size=16, seq_len=2048)
    with pytest.raises(HaapInputError, match="megatron runtime runs ZeRO 0, 1"):
        presolve.build(M8, C16, tr, SolveOptions(zero=(3,)))


def _plan(pp, z, engine="fsdp"):
    tr = TrainingSpec(global_batch_size=16, seq_len=2048, engine=engine)
    p = uniform_plan(M8, C16, tr, 2, pp, 8 // pp, 1, 1, "none", 1, 1, 1)
    return p.model_copy(update={"stages": tuple(s.model_copy(update={"zero": z}) for s in p.stages)}), tr


def test_checker_and_emitters():
    p, tr = _plan(1, 3)
    assert check_plan(p, M8, C16, tr, memory=False) == []
    ds = TrainingSpec(global_batch_size=16, seq_len=2048, engine="deepspeed")
    assert any(v.rule == "target.zero" for v in check_plan(p, M8, C16, ds, memory=False))
    par = torchtitan.parallelism(p, M8)
    assert (par["data_parallel_shard_degree"], par["fsdp_reshard_after_forward"]) == (8, "always")
    assert any(v.rule == "megatron.zero" for v in megatron.plan_violations(p, M8))
    assert any(v.rule == "flagscale.zero" for v in flagscale.plan_violations(p, M8))
    p2, _ = _plan(2, 3)
    assert any(v.rule == "torchtitan.zero" for v in torchtitan.plan_violations(p2, M8))
    p1, _ = _plan(2, 1)
    assert not [v for v in torchtitan.plan_violations(p1, M8) if v.rule == "torchtitan.zero"]
    assert torchtitan.parallelism(p1, M8)["data_parallel_shard_degree"] == 4
    p0, _ = _plan(2, 0)
    assert torchtitan.parallelism(p0, M8)["data_parallel_replicate_degree"] == 4
    assert "--use-distributed-optimizer" not in " ".join(megatron.emit(p0, C16, M8, tr).values())


def test_uniform_target_drops_a_zero_stage_outclassed_everywhere():
    """Under eq. U1 a ZeRO stage worse than another in every group leaves the search (zero.drop_outclassed_stages);
    the exact optimum is that of the search without it or better (the runtime's stage stays in the set)."""
    tr = TrainingSpec(global_batch_size=32, seq_len=4096)
    opts = SolveOptions(time_limit_s=30, threads=1, relative_gap=0.0, target="megatron", max_stages=2,
                        micro_batch_sizes=(16,))
    base = planner.solve(M8, C16, tr, opts)
    out = planner.solve(M8, C16, tr, opts.model_copy(update={"zero": "auto"}))
    assert out.violations == [] and out.result.plan.is_uniform
    assert out.result.objective_s <= base.result.objective_s * (1 + 1e-9)
    kept = out.presolved.stats["options_kept"]
    assert kept < 2 * base.presolved.stats["options_kept"]  # ZeRO-0 (same traffic, more memory) mostly dropped


@pytest.mark.parametrize("args", [["--zero", "3", "--no-dist-opt"], ["--zero", "2"], ["--zero", "five"],
                                  ["--zero", "1", "--zero-stage", "3"]])
def test_cli_zero_errors_exit_2(run_cli, args):
    code, _, err = run_cli(["solve", "-m", "opt-350m", "-c", "a100-40g:8", "--time-limit", "5", *args])
    assert code == 2 and "--zero" in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["--zero-stage", "3", "--no-dist-opt"], ["--zero-stage", "1", "--no-dist-opt"]])
def test_cli_zero_stage_against_no_dist_opt_exits_2(run_cli, args):
    """A sharding stage beside plain data parallel is refused in the flags' own words (it was accepted, the result
    holding both zero_stage 3 and distributed_optimizer false); a training file gets the same rule in its fields."""
    code, _, err = run_cli(["solve", "-m", "opt-350m", "-c", "a100-40g:8", "--time-limit", "5", *args])
    assert code == 2 and f"--zero-stage {args[1]} conflicts with --no-dist-opt" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="distributed_optimizer is off"):
        TrainingSpec(zero_stage=2, distributed_optimizer=False)
    assert TrainingSpec(zero_stage=0, distributed_optimizer=False).zero_stage == 0


def test_cli_estimate_zero_reprices_the_plan(run_cli):
    base = ["estimate", "-m", "opt-350m", "-c", "a100-40g:8", "--dp", "8", "--seq", "2048", "--engine", "fsdp"]
    code, out, _ = run_cli(base + ["--zero", "2"])
    assert code == 0 and "fsdp, ZeRO 2" in out
    code, _, err = run_cli(base + ["--zero", "0", "--dist-opt"])
    assert code == 2 and "--zero" in err


def test_zero_2_or_3_under_the_megatron_runtime_exits_2(run_cli, tmp_path):
    """The megatron preset runs ZeRO 0 or 1; a fixed ZeRO-2/3 there was priced as such while the Megatron emitter
    launched ZeRO-1 (fuzz). Refused in the flag's words, in a training file's field's words; fsdp takes it."""
    base = ["solve", "-m", "opt-350m", "-c", "a100-40g:8", "--gbs", "16", "--time-limit", "5"]
    code, _, err = run_cli([*base, "--target", "megatron", "--zero-stage", "3"])
    assert code == 2 and "--zero-stage 3" in err and "--engine fsdp" in err and "Traceback" not in err, err
    f = tmp_path / "t.yaml"
    f.write_text("global_batch_size: 16\nseq_len: 2048\nengine: megatron\nzero_stage: 2\n")
    code, _, err = run_cli(["solve", "-m", "opt-350m", "-c", "a100-40g:8", "--training", str(f), "--time-limit", "5"])
    assert code == 2 and "zero_stage 2 with engine megatron" in err, err
    assert run_cli([*base, "--engine", "fsdp", "--zero-stage", "3"])[0] == 0
