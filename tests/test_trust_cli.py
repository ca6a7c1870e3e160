"""`haap-solve simulate` and `haap-solve emit` end to end (in-process, real entry point)."""

from __future__ import annotations

import json

from _emit_cases import DENSE, H100_A100, ISLANDS, LLAMA8B, TIED, hetero_plan, hetero_uniform_plan, llama_hetero_plan
from conftest import invoke_cli


def _plan_file(tmp_path, plan, model=None, cluster=None, name="plan.json"):
    doc = {"status": "OPTIMAL", "plan": plan.model_dump(mode="json")}
    if model is not None:
        doc.update(model=model.model_dump(mode="json"), cluster=cluster.model_dump(mode="json"))
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_simulate_table_json_and_plots(tmp_path):
    f = _plan_file(tmp_path, hetero_uniform_plan(), DENSE, H100_A100)
    code, out, err = invoke_cli(["simulate", f])
    assert code == 0, err
    assert "simulated" in out and "closed form" in out
    code, out, err = invoke_cli(["simulate", f, "--json", "--plot", str(tmp_path / "plots")])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["num_stages"] == 2 and doc["iteration_time_s"] > 0
    assert abs(doc["closed_form_s"] - doc["estimator_iteration_s"]) < 1e-9 * doc["closed_form_s"]
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["memory.png", "memory.svg", "timeline.png", "timeline.svg"]
    assert all((tmp_path / "plots" / n).stat().st_size > 3000 for n in names)


def test_simulate_needs_model_and_cluster(tmp_path):
    f = _plan_file(tmp_path, hetero_uniform_plan())
    code, _out, err = invoke_cli(["simulate", f])
    assert code == 2 and "--model and --cluster" in err and "Traceback" not in err


def test_emit_writes_files_and_refuses_with_a_pointer(tmp_path):
    f = _plan_file(tmp_path, hetero_plan(), TIED, ISLANDS)
    code, _out, err = invoke_cli(["emit", f, "--target", "flagscale", "--out", str(tmp_path / "fs")])
    assert code == 0, err
    assert {p.name for p in (tmp_path / "fs").iterdir()} == {"flagscale_train.yaml", "hostfile", "rank_map.json",
                                                            "LAUNCH.txt", "nccl_env.sh"}
    assert "You must supply" in err and "python run.py" in err  # the launch command and the inputs, printed
    code, _out, err = invoke_cli(["emit", f, "--target", "megatron"])
    assert code == 2 and "flagscale" in err and "Traceback" not in err
    code, _out, err = invoke_cli(["emit", f, "--target", "nemo"])
    assert code == 2 and "megatron, flagscale, torchtitan" in err


def test_emit_to_stdout(tmp_path):
    f = _plan_file(tmp_path, llama_hetero_plan(), LLAMA8B, H100_A100)
    code, out, err = invoke_cli(["emit", f, "--target", "torchtitan"])
    assert code == 0, err
    assert "# ===== haap_torchtitan.py" in out and "module_fqns_per_model_part" in out
    code, out, err = invoke_cli(["emit", f, "--target", "torchtitan", "--engine-version", "0.1"])
    assert code == 0, err
    assert "# ===== torchtitan.toml" in out
