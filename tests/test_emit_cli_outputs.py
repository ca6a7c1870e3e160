"""`haap-solve emit` as a user meets it: the exact launch command and the inputs still to supply are printed;
a plan that does not fit in memory is refused before anything is written; a write that fails midway leaves
no partial folder (and an existing folder as it was)."""

from __future__ import annotations

import json

from _emit_cases import A100_16, H100_A100, LLAMA8B, llama_hetero_plan
from conftest import invoke_cli

from haap_milp.emit.launch import command
from haap_milp.emit.torchtitan import SUPPLIES
from haap_milp.specs import Plan, StagePlan


def _plan_file(tmp_path, plan, model, cluster) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"status": "OPTIMAL", "plan": plan.model_dump(mode="json"),
                                "model": model.model_dump(mode="json"), "cluster": cluster.model_dump(mode="json")}))
    return str(path)


def test_emit_prints_the_launch_command_and_what_to_supply(tmp_path):
    f = _plan_file(tmp_path, llama_hetero_plan(), LLAMA8B, H100_A100)
    code, _out, err = invoke_cli(["emit", f, "--target", "torchtitan", "--out", str(tmp_path / "tt")])
    assert code == 0, err
    assert command(SUPPLIES) in err  # the one command to run on every node, verbatim
    for s in SUPPLIES:  # each input the launch script refuses to start without
        assert f"{s.var}: {s.what}" in err
    launch = (tmp_path / "tt" / "launch.sh").read_text()
    assert all(f'${{{s.var}:?' in launch for s in SUPPLIES)


def _unfitting_plan() -> Plan:
    """llama3-8b on one stage of tp 1: ~8e9 params with Adam state (16 B/param, ~120 GiB) on an 80 GiB A100."""
    st = (StagePlan(first_layer=0, num_layers=LLAMA8B.num_layers, gpu_type="a100-80g", tp=1, dp=16),)
    return Plan(model=LLAMA8B.name, stages=st, micro_batch_size=1, num_microbatches=4, global_batch_size=64,
                seq_len=4096, distributed_optimizer=False)


def test_emit_refuses_a_plan_that_does_not_fit_and_writes_nothing(tmp_path):
    f = _plan_file(tmp_path, _unfitting_plan(), LLAMA8B, A100_16)
    out = tmp_path / "never"
    code, _out, err = invoke_cli(["emit", f, "--target", "megatron", "--out", str(out)])
    assert code == 2 and "Traceback" not in err
    assert "GiB" in err  # the memory it needs, in words
    assert not out.exists()


def test_emit_failing_midway_leaves_no_partial_folder(tmp_path):
    f = _plan_file(tmp_path, llama_hetero_plan(), LLAMA8B, H100_A100)
    out = tmp_path / "existing"
    (out / "hostfile").mkdir(parents=True)  # a folder where a file must go: the write fails after others were made
    (out / "keep.txt").write_text("mine")
    code, _out, err = invoke_cli(["emit", f, "--target", "megatron", "--out", str(out)])
    assert code == 2 and "Traceback" not in err and "--out" in err
    assert sorted(p.name for p in out.iterdir()) == ["hostfile", "keep.txt"]  # nothing added, nothing removed
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # scratch folder cleaned up


def test_a_plan_no_target_runs_is_told_so_not_sent_round(tmp_path):
    """Per-stage tp and interleaving: megatron's rule points to flagscale, flagscale's to megatron (fuzz: a circle).
    The refusal ends with what is true of all three: none runs it, solve again with the target; a plan another
    target runs names that target."""
    st = tuple(StagePlan(first_layer=8 * i, num_layers=8, gpu_type="a100-80g", tp=2 if i == 0 else 1, dp=2)
               for i in range(4))
    plan = Plan(model=LLAMA8B.name, stages=st, micro_batch_size=1, num_microbatches=8, global_batch_size=16,
                seq_len=4096, vpp=2, schedule="interleaved")
    f = _plan_file(tmp_path, plan, LLAMA8B, A100_16)
    for target in ("megatron", "flagscale", "torchtitan"):
        code, _out, err = invoke_cli(["emit", f, "--target", target])
        assert code == 2 and f"solve again with --target {target}" in err.replace("\n", " "), err
    flat = plan.model_copy(update={"vpp": 1, "schedule": "1f1b"})
    code, _out, err = invoke_cli(["emit", _plan_file(tmp_path, flat, LLAMA8B, A100_16), "--target", "megatron"])
    assert code == 2 and "It runs on --target flagscale" in err.replace("\n", " "), err
