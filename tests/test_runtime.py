"""The training runtime as input: fp32/tf32, engine presets, ZeRO stages, overlap, recompute set, fixed
micro-batch, uniform dimensions, --training FILE, and estimate's defaults (README "Training runtime")."""

from __future__ import annotations

import json

import pytest

from haap_milp import planner, presolve
from haap_milp.catalog import load_cluster, load_gpu, load_model
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator, compute, memory, runtime
from haap_milp.estimator.kernels import Implementation
from haap_milp.specs import SolveOptions, TrainingSpec

OPT = load_model("opt-350m")


# --------------------------------------------------------------------------- fp32 / tf32 units and bytes


def test_fp32_priced_on_cuda_cores_without_tf32_and_on_tf32_with_it():
    v100, a100, h100 = load_gpu("v100-16g"), load_gpu("a100-40g"), load_gpu("h100-80g")
    assert compute.peak_flops(v100, "fp32") == pytest.approx(15.7e12)  # no tensor cores for fp32 on Volta
    assert compute.peak_flops(a100, "fp32") == pytest.approx(156e12)  # TF32 tensor cores
    assert compute.peak_flops(a100, "tf32") == pytest.approx(156e12)
    assert compute.peak_flops(h100, "tf32") == pytest.approx(494.7e12)
    assert v100.peak_tflops("tf32") is None
    c = load_cluster("v100-16g:8")
    with pytest.raises(HaapInputError, match="does not support precision 'tf32'"):
        Estimator(OPT, c, TrainingSpec(precision="tf32")).layer_cost("v100-16g", 1, 1, 1, 1, "none", 1)


def test_fp32_v100_gemm_time_is_flops_over_the_cuda_core_peak():
    from haap_milp.estimator.flops import Gemm

    gpu = load_gpu("v100-16g")
    p = Estimator(OPT, load_cluster("v100-16g:8"), TrainingSpec()).calibration.params(gpu)
    g = Gemm(8192, 8192, 8192)  # compute bound
    expected = 2 * 8192**3 / (15.7e12 * compute.SIMT_SGEMM_EFF) + p.kernel_latency_s  # SIMT SGEMM, not tensor cores
    assert compute.gemm_time_s(g, gpu, p, "fp32") == pytest.approx(expected)


def test_fp32_doubles_activation_and_message_bytes():
    c = load_cluster("a100-40g:8")
    fp32 = Estimator(OPT, c, TrainingSpec(precision="fp32", seq_len=2048))
    # fp32 takes the unfused attention path (no FlashAttention in fp32); the same path at bf16 stores half
    bf16 = Estimator(OPT, c, TrainingSpec(precision="bf16", seq_len=2048), impl=Implementation(flash_attention=False))
    for tp, rc in ((1, "none"), (2, "selective"), (4, "full")):
        a32 = fp32.layer_cost("a100-40g", tp, 1, 1, 1, rc, 2).act_bytes
        a16 = bf16.layer_cost("a100-40g", tp, 1, 1, 1, rc, 2).act_bytes
        assert a32 == pytest.approx(2 * a16)
    hw = fp32.hardware("a100-40g")
    lat = hw.nic_gpu.latency_s
    t32 = fp32.p2p_time(("a100-40g", "main"), ("a100-40g", "main"), 4)
    t16 = bf16.p2p_time(("a100-40g", "main"), ("a100-40g", "main"), 4)
    assert t32 - 2 * lat == pytest.approx(2 * (t16 - 2 * lat))  # bytes doubled, latency not


def test_fp32_bytes_per_param_is_16_for_adam_without_a_master_copy():
    assert memory.param_bytes("fp32", 0, 8, 12.0).total == 16.0  # 4 w + 4 g + 8 (m, v): ZeRO paper sec. 3.1
    assert memory.param_bytes("bf16", 0, 8, 12.0).total == 18.0  # Megatron's table, unchanged
    zero3 = memory.param_bytes("bf16", 3, 8, 12.0)
    assert (zero3.weights, zero3.grads, zero3.optimizer) == (2 / 8, 4 / 8, 12 / 8)


# --------------------------------------------------------------------------- engines and DP sync


def test_deepspeed_no_dist_opt_exposes_a_ring_all_reduce_of_fp32_grads():
    """8 GPUs in one node, dp 8, tp 1: ring all-reduce 2(n-1)/n·M/B on NVLink, M = 4 bytes x params,
    after the backward (nothing hidden), + the unsharded Adam step at 32 B/param."""
    c = load_cluster("a100-40g:8")
    tr = TrainingSpec(precision="fp32", seq_len=2048, engine="deepspeed", distributed_optimizer=False)
    est = Estimator(OPT, c, tr)
    hw = est.hardware("a100-40g")
    params = memory.dense_layer_params_per_gpu(OPT, 1)
    ring = 2 * 7 / 8 * 4 * params / (300e9 * hw.params.nvlink_eff)
    opt = params * 32.0 / (1555e9 * hw.params.hbm_eff)
    cost = est.layer_cost("a100-40g", 1, 8, 1, 1, "none", 8)
    assert cost.dp_comm_s == pytest.approx(ring)
    assert cost.sync_s == pytest.approx(ring + opt)
    lat = est.calibration.globals.intra_latency_s
    assert est.stage_fixed_sync_s("a100-40g", None, 1, 8) == pytest.approx(2 * 7 * lat)
    # the same runtime with overlap on hides the calibrated share; Megatron's default sync is unchanged by this
    on = Estimator(OPT, c, tr.model_copy(update={"grad_reduce_overlap": True}))
    hidden = est.calibration.globals.dp_overlap
    assert on.layer_cost("a100-40g", 1, 8, 1, 1, "none", 8).sync_s == pytest.approx((1 - hidden) * ring + opt)


def test_engine_presets_and_overrides():
    r = runtime.resolve(TrainingSpec())
    assert (r.engine, r.zero_stage, r.grad_overlap, r.param_overlap, r.bucket_bytes) == \
        ("megatron", 1, True, True, None)
    ds = runtime.resolve(TrainingSpec(engine="deepspeed", distributed_optimizer=False, precision="fp32"))
    assert (ds.zero_stage, ds.grad_overlap, ds.bucket_bytes) == (0, False, 5e8 * 4)
    assert runtime.resolve(TrainingSpec(engine="fsdp")).zero_stage == 3
    assert runtime.resolve(TrainingSpec(engine="deepspeed", grad_bucket_bytes=5e8, zero_stage=2)).bucket_bytes == 5e8


def test_fsdp_shards_weights_and_pays_gathers_per_microbatch():
    c = load_cluster("a100-80g:16")
    mg = Estimator(load_model("llama3-8b"), c, TrainingSpec(seq_len=2048)).layer_cost("a100-80g", 1, 8, 1, 1, "full", 8)
    fs = Estimator(load_model("llama3-8b"), c, TrainingSpec(seq_len=2048, engine="fsdp")).layer_cost(
        "a100-80g", 1, 8, 1, 1, "full", 8)
    assert fs.weights_bytes == pytest.approx(mg.weights_bytes / 8)
    assert mg.zero3_comm_s == 0
    assert fs.time_s == pytest.approx(mg.time_s + fs.zero3_comm_s)
    # without prefetch (eq. Z4) the gathers and the reduce-scatter of every micro-batch are all exposed
    bare = Estimator(load_model("llama3-8b"), c, TrainingSpec(seq_len=2048, engine="fsdp", param_gather_overlap=False,
                                                               grad_reduce_overlap=False)).layer_cost(
        "a100-80g", 1, 8, 1, 1, "full", 8)
    assert bare.zero3_comm_s > fs.zero3_comm_s >= 0
    assert bare.time_s == pytest.approx(mg.time_s + bare.zero3_comm_s)


PINNED = {  # values of the packaged calibration (issue #12 refit after the merge of the memory and time rounds, 2026-12-01): layer time, sync, static bytes, act bytes,
    # embedding sync, head time, stage latency, p2p - the default runtime must keep them exactly
    ("llama3-8b", "a100-80g:64,h100-80g:32", 512, "bf16", "a100-80g", 2, 4, "selective"):
        (0.014779762385786634, 0.00266560945018297, 981540864.0, 285474816.0, 0.006420048179273399,
         0.032476069753510806, 6e-06, 0.00020737901176470588),
    ("gpt3-1.3b", "a100-40g:32/4,v100-16g:96/4", 1024, "fp16", "v100-16g", 4, 2, "full"):
        (0.014415887420508132, 0.005036446075816993, 151062528.0, 8388608.0, 0.01029473585359477,
         0.017837008962573227, 9.999999999999999e-06, 0.00027317201568627446),
    ("mixtral-8x7b", "h100-80g:64", 256, "fp8", "h100-80g", 2, 4, "none"):
        (0.012813881777540897, 0.023649976500267893, 10758758400.0, 436535296.0, 0.0010480618446230387,
         0.0020677781570353237, 6e-06, 0.00010868950588235294),
}


@pytest.mark.parametrize("key", list(PINNED))
def test_default_runtime_numbers_are_unchanged(key):
    m, c, gbs, prec, g, tp, dp, rc = key
    est = Estimator(load_model(m), load_cluster(c), TrainingSpec(global_batch_size=gbs, precision=prec, seq_len=2048))
    lc = est.layer_cost(g, tp, dp, 1, 1, rc, 8)
    got = (lc.time_s, lc.sync_s, lc.static_bytes, lc.act_bytes, est.first_stage_extra(g, tp, dp, 1, 1, rc, 8).sync_s,
           est.last_stage_extra(g, tp, dp, 1, 1, rc, 8).time_s, est.stage_fixed_sync_s(g, None, tp, dp),
           est.p2p_time((g, "main"), (g, "main"), 8))
    assert got == PINNED[key]  # exact: same plans, same numbers


# --------------------------------------------------------------------------- search restrictions


def _presolved(training, cluster="a100-40g:8/4,v100-16g:16/4", model=OPT):
    m, c = model, load_cluster(cluster)
    return presolve.build(m, c, training, SolveOptions(solver="dp", time_limit_s=10))


def test_recompute_none_never_yields_recompute():
    tr = TrainingSpec(global_batch_size=64, seq_len=2048, recompute_modes=("none",))
    pre = _presolved(tr)
    assert {o.recompute for o in pre.problem.options} == {"none"}
    out = planner.solve(OPT, load_cluster("a100-40g:8/4,v100-16g:16/4"), tr, SolveOptions(solver="dp"))
    assert out.result.plan is not None and {s.recompute for s in out.result.plan.stages} == {"none"}


def test_fixed_micro_batch_is_the_only_per_replica_size():
    tr = TrainingSpec(global_batch_size=64, seq_len=2048, micro_batch_size=2)
    pre = _presolved(tr)
    for v in pre.problem.variants:
        for o, ok in zip(pre.problem.options, v.allowed, strict=True):
            if ok:
                assert v.samples_per_microbatch == 2 * o.dp
    out = planner.solve(OPT, load_cluster("a100-40g:8/4,v100-16g:16/4"), tr, SolveOptions(solver="dp"))
    plan = out.result.plan
    assert all(plan.stage_micro_batch(j) == 2 for j in range(plan.pp))


def test_uniform_dp_yields_equal_dp_and_leaves_tp_free():
    cluster = load_cluster("a100-40g:8/4,v100-16g:24/4")
    free = planner.solve(OPT, cluster, TrainingSpec(global_batch_size=96, seq_len=2048), SolveOptions(solver="cpsat",
                                                                                                     time_limit_s=20))
    tr = TrainingSpec(global_batch_size=96, seq_len=2048, uniform=("dp",))
    pre = _presolved(tr, "a100-40g:8/4,v100-16g:24/4")
    assert pre.problem.uniform and {o.signature for o in pre.problem.options} == {(o.dp,) for o in pre.problem.options}
    out = planner.solve(OPT, cluster, tr, SolveOptions(solver="cpsat", time_limit_s=20))
    plan = out.result.plan
    assert plan is not None and len({s.dp for s in plan.stages}) == 1
    assert not out.violations
    assert out.result.objective_s >= free.result.objective_s * (1 - 1e-9)  # a restriction never helps


def test_checker_reports_runtime_rules():
    from haap_milp.check import check_plan

    out = planner.solve(OPT, load_cluster("a100-40g:8/4,v100-16g:16/4"),
                        TrainingSpec(global_batch_size=64, seq_len=2048), SolveOptions(solver="dp"))
    plan = out.result.plan
    strict = TrainingSpec(global_batch_size=64, seq_len=2048, recompute_modes=("full",), micro_batch_size=64,
                          uniform=("tp", "dp", "mbs", "recompute"))
    rules = {v.rule for v in check_plan(plan, OPT, load_cluster("a100-40g:8/4,v100-16g:16/4"), strict, memory=False)}
    assert {"runtime.recompute", "runtime.mbs"} <= rules


# --------------------------------------------------------------------------- CLI


SOLVE = ["solve", "-m", "opt-350m", "-c", "a100-40g:8/4,v100-16g:16/4", "--gbs", "64", "--seq", "2048",
         "--time-limit", "10", "--solver", "dp"]


def test_target_command_runtime_flags(run_cli):
    code, out, err = run_cli(SOLVE + ["--precision", "fp32", "--engine", "deepspeed", "--no-dist-opt", "--recompute",
                                      "none", "--uniform", "dp", "--json", "-"])
    assert code == 0, err
    doc = json.loads(out)
    plan = doc["plan"]
    assert plan["precision"] == "fp32" and plan["distributed_optimizer"] is False
    assert len({s["dp"] for s in plan["stages"]}) == 1 and {s["recompute"] for s in plan["stages"]} == {"none"}


def test_training_file_round_trip_and_flags_override(run_cli, tmp_path):
    f = tmp_path / "train.yaml"
    f.write_text("global_batch_size: 64\nseq_len: 2048\nprecision: fp32\nengine: deepspeed\ndistributed_optimizer: "
                 "false\nrecompute_modes: [none]\nuniform: [dp]\ngrad_bucket_bytes: 5.0e8\n")
    base = ["solve", "-m", "opt-350m", "-c", "a100-40g:8/4,v100-16g:16/4", "--time-limit", "10", "--solver", "dp",
            "--json", "-", "--training", str(f)]
    code, out, err = run_cli(base)
    assert code == 0, err
    doc = json.loads(out)
    spec = TrainingSpec.model_validate(doc["training"])
    assert (spec.precision, spec.engine, spec.recompute_modes, spec.uniform, spec.grad_bucket_bytes) == \
        ("fp32", "deepspeed", ("none",), ("dp",), 5e8)
    (tmp_path / "again.yaml").write_text(json.dumps(doc["training"]))  # the output reads back as a training file
    code, out2, err = run_cli(base[:-1] + [str(tmp_path / "again.yaml")])
    assert code == 0, err
    assert json.loads(out2)["training"] == doc["training"]
    code, out, err = run_cli(base + ["--engine", "megatron", "--gbs", "32"])
    assert code == 0, err
    tr = TrainingSpec.model_validate(json.loads(out)["training"])
    assert tr.engine == "megatron" and tr.global_batch_size == 32 and tr.precision == "fp32"


def test_training_file_with_an_unknown_key_exits_2(run_cli, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("engine: deepspeed\noverlap_everything: true\n")
    code, _, err = run_cli(SOLVE + ["--training", str(f)])
    assert code == 2 and "overlap_everything" in err
    code, _, err = run_cli(SOLVE + ["--training", str(tmp_path / "missing.yaml")])
    assert code == 2 and "--training" in err
    f.write_text("grad_reduce_in_fp32: sometimes\n")  # a field of issue 12's round: a bad value names it
    code, _, err = run_cli(SOLVE + ["--training", str(f)])
    assert code == 2 and "grad_reduce_in_fp32" in err and "Traceback" not in err


@pytest.mark.parametrize(("flag", "value"), [("--engine", "horovod"), ("--zero-stage", "4"), ("--recompute", "some"),
                                             ("--uniform", "pp"), ("--mbs", "0"), ("--grad-bucket", "-1"),
                                             ("--precision", "fp64"), ("--opt-state-bytes", "-2"),
                                             ("--grad-overlap", "maybe"), ("--param-overlap", "2")])
@pytest.mark.parametrize("command", ["solve", "compare"])
def test_bad_runtime_flag_exits_2_naming_the_flag(run_cli, command, flag, value):
    args = [command] + SOLVE[1:] if command == "solve" else ["compare"] + SOLVE[1:-2]
    code, _, err = run_cli(args + [flag, value])
    assert code == 2, err
    assert flag in err and "Traceback" not in err


def test_estimate_bad_runtime_flag_exits_2(run_cli):
    base = ["estimate", "-m", "opt-350m", "-c", "a100-40g:8", "--dp", "8", "--seq", "2048"]
    for flag, value in (("--engine", "horovod"), ("--zero-stage", "7"), ("--grad-overlap", "yes please"),
                        ("--grad-bucket", "0"), ("--precision", "fp64")):
        code, _, err = run_cli(base + [flag, value])
        assert code == 2 and flag in err, (flag, err)


def test_uniform_tp_and_recompute_constrain_only_those():
    tr = TrainingSpec(global_batch_size=64, seq_len=2048, uniform=("tp", "recompute"))
    pre = _presolved(tr)
    assert {o.signature for o in pre.problem.options} == {(o.tp, o.recompute) for o in pre.problem.options}
    out = planner.solve(OPT, load_cluster("a100-40g:8/4,v100-16g:16/4"), tr, SolveOptions(solver="dp"))
    plan = out.result.plan
    assert len({(s.tp, s.recompute) for s in plan.stages}) == 1 and not out.violations


@pytest.mark.parametrize("command", ["solve", "compare", "estimate"])
def test_help_lists_the_runtime_flags(run_cli, command):
    code, out, _ = run_cli([command, "--help"])
    assert code == 0
    for flag in ("--training", "--engine", "--zero-stage", "--grad-overlap", "--param-overlap", "--grad-bucket",
                 "--opt-state-bytes", "--precision"):
        assert flag in out
    if command != "estimate":
        assert "--uniform" in out and "--recompute" in out and "--mbs" in out


def test_estimate_uses_solve_defaults_and_prints_seq_and_gbs(run_cli):
    base = ["estimate", "-m", "llama3-8b", "-c", "h100-80g:64", "--tp", "2", "--pp", "4", "--dp", "8"]
    code, out, err = run_cli(base + ["--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["seq_len"], doc["global_batch_size"]) == (4096, 512)  # solve's defaults, not the model's 8192
    assert doc["runtime"]["engine"] == "megatron"
    code, out, err = run_cli(base)
    assert code == 0, err
    assert "seq 4096 | gbs 512" in out


def test_estimate_runtime_flags_change_the_sync(run_cli):
    base = ["estimate", "-m", "opt-350m", "-c", "a100-40g:8", "--dp", "8", "--gbs", "64", "--seq", "2048",
            "--precision", "fp32", "--json"]
    _, a, _ = run_cli(base)
    code, b, err = run_cli(base + ["--engine", "deepspeed", "--no-dist-opt"])
    assert code == 0, err
    sa = json.loads(a)["stages"][0]["breakdown"]["sync_s"]
    sb = json.loads(b)["stages"][0]["breakdown"]["sync_s"]
    assert sb > sa and json.loads(b)["runtime"]["zero_stage"] == 0
