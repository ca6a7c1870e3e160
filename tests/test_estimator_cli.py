"""`haap-solve estimate`: JSON fields, agreement with the library, every impossible input -> exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from haap_milp.catalog import load_cluster, load_model
from haap_milp.estimator import Estimator
from haap_milp.specs import TrainingSpec

PROFILES = Path(__file__).parent / "data" / "profiles"
BASE = ["estimate", "--model", "llama3-8b", "--cluster", "h100-64", "--gbs", "128", "--seq", "4096"]


def test_json_flag_form_matches_the_library(run_cli):
    code, out, err = run_cli(BASE + ["--tp", "2", "--pp", "4", "--dp", "8", "--mbs", "1", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    for key in ("iteration_time_s", "tokens_per_s", "tflops_per_gpu", "hw_tflops_per_gpu", "mfu", "peak_memory_gib",
                "stages", "compute_bound"):
        assert key in doc
    assert {"memory_gib", "time_s", "breakdown"} <= set(doc["stages"][0])
    assert {"compute_s", "tp_comm_s", "p2p_s", "bubble_s", "sync_s", "weights_gib", "activations_gib"} <= set(
        doc["stages"][0]["breakdown"])
    m, c = load_model("llama3-8b"), load_cluster("h100-64")
    from haap_milp.cli.estimate_cmd import uniform_plan

    tr = TrainingSpec(global_batch_size=128, seq_len=4096)
    pe = Estimator(m, c, tr).estimate(uniform_plan(m, c, tr, 2, 4, 8, 1, 1, "none", 1, 1, 1))
    assert doc["iteration_time_s"] == pytest.approx(pe.iteration_time_s, rel=1e-12)
    assert sum(s["num_layers"] for s in doc["stages"]) == 32


def test_table_output(run_cli):
    code, out, _ = run_cli(BASE + ["--tp", "4", "--pp", "2", "--dp", "8", "--mbs", "2", "--vpp", "2",
                                   "--recompute", "selective"])
    assert code == 0 and "MFU" in out and "interleaved" in out and "h100-80g" in out


@pytest.mark.parametrize("extra,needle", [
    (["--tp", "2", "--pp", "2", "--dp", "2", "--mbs", "1"], "GPUs"),
    (["--tp", "3", "--pp", "1", "--dp", "21", "--mbs", "1"], "GPUs"),
    (["--tp", "8", "--pp", "1", "--dp", "8", "--mbs", "3"], "divisible"),
    (["--tp", "1", "--pp", "1", "--dp", "64", "--mbs", "1", "--ep", "2"], "ep"),
    (["--tp", "1", "--pp", "1", "--dp", "64", "--mbs", "1", "--recompute", "half"], "recompute"),
    (["--tp", "16", "--pp", "1", "--dp", "4", "--mbs", "1"], "tp"),
])
def test_impossible_combinations_exit_2(run_cli, extra, needle):
    code, _, err = run_cli(BASE + extra)
    assert code == 2 and needle in err and "Traceback" not in err


def test_tp_not_dividing_heads(run_cli):
    code, _, err = run_cli(["estimate", "--model", "llama3-8b", "--cluster", "h100-80g:48", "--gbs", "48",
                            "--tp", "3", "--dp", "16", "--mbs", "1"])
    assert code == 2 and "heads" in err


def test_precision_unsupported_by_gpu(run_cli):
    code, _, err = run_cli(["estimate", "--model", "opt-350m", "--cluster", "v100-16g:8", "--gbs", "8", "--dp", "8",
                            "--precision", "bf16"])
    assert code == 2 and "bf16" in err


def test_plan_that_does_not_fit_reports_numbers(run_cli):
    code, out, err = run_cli(["estimate", "--model", "llama3-70b", "--cluster", "h100-64", "--gbs", "64", "--tp", "1",
                              "--pp", "1", "--dp", "64", "--mbs", "1", "--json"])
    assert code == 2 and err.startswith("DOES NOT FIT") and "GiB" in err
    doc = json.loads(out)
    assert doc["fits"] is False and doc["peak_memory_gib"] > 80


def test_plan_file_forms(run_cli, tmp_path):
    m, c = load_model("llama3-8b"), load_cluster("h100-a100-32")
    from haap_milp.specs import Plan, StagePlan

    plan = Plan(model=m.name, stages=(
        StagePlan(first_layer=0, num_layers=22, gpu_type="h100-80g", tp=2, dp=8),
        StagePlan(first_layer=22, num_layers=10, gpu_type="a100-80g", tp=2, dp=8)),
        micro_batch_size=1, num_microbatches=8, global_batch_size=64, seq_len=4096)
    full = tmp_path / "sol.json"
    full.write_text(json.dumps({"status": "OPTIMAL", "plan": plan.model_dump(mode="json"),
                                "model": m.model_dump(mode="json"), "cluster": c.model_dump(mode="json")}))
    code, out, err = run_cli(["estimate", "--plan", str(full), "--json"])
    assert code in (0, 2), err
    doc = json.loads(out)
    assert [s["gpu_type"] for s in doc["stages"]] == ["h100-80g", "a100-80g"]
    bare = tmp_path / "plan.json"
    bare.write_text(plan.model_dump_json())
    code, _, err = run_cli(["estimate", "--plan", str(bare)])
    assert code == 2 and "--model" in err
    code, out2, _ = run_cli(["estimate", "--plan", str(bare), "--model", "llama3-8b", "--cluster", "h100-a100-32",
                             "--json"])
    assert json.loads(out2)["iteration_time_s"] == pytest.approx(doc["iteration_time_s"])
    # an explicit --no-dist-opt re-prices the plan (ZeRO-0: the whole optimizer state on every replica)
    code, out3, _ = run_cli(["estimate", "--plan", str(full), "--no-dist-opt", "--json"])
    assert max(s["memory_gib"] for s in json.loads(out3)["stages"]) > max(s["memory_gib"] for s in doc["stages"])


def test_profile_option(run_cli):
    args = ["estimate", "--model", "opt-350m", "--cluster", "a100-40g:8", "--gbs", "16", "--seq", "2048", "--tp", "2",
            "--dp", "4", "--mbs", "2", "--precision", "fp16", "--json"]
    code, plain, err = run_cli(args)
    assert code == 0, err
    code, prof, err = run_cli(args + ["--profile", str(PROFILES / "OPT-350")])
    assert code == 0, err
    t_prof = json.loads(prof)["stages"][0]["time_s"]
    raw = json.loads((PROFILES / "OPT-350" / "DeviceType.A100_tp2_bs2.json").read_text())
    ms = raw["execution_time"]["layer_compute_total_ms"]
    assert t_prof == pytest.approx(sum(ms) / 1e3, rel=1e-6)
    assert json.loads(plain)["stages"][0]["time_s"] != pytest.approx(t_prof)
    code, _, err = run_cli(args + ["--profile", str(PROFILES / "OPT-350"), "--profile-device", "A100"])
    assert code == 2 and "A100=a100-80g" in err
