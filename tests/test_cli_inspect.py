"""`haap-solve catalog | show | schema | validate`, run in-process through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_inputs_hf_config import LLAMA3_8B, MIXTRAL_8X7B

from haap_milp.catalog import cluster_names, gpu_names, load_model, model_names


def ok_json(run_cli, args: list[str]) -> dict:
    code, out, err = run_cli(args)
    assert code == 0, err
    return json.loads(out)


def test_show_llama3_70b_json_about_70_6b(run_cli) -> None:
    data = ok_json(run_cli, ["show", "llama3-70b", "--json"])
    assert data["kind"] == "model"
    assert data["num_params_total"] == pytest.approx(70.6e9, rel=0.01)  # HF model page: 70.6B params
    assert data["weight_memory_bf16_gib"] == pytest.approx(data["num_params_total"] * 2 / 2**30)
    assert data["shapes"]["num_kv_heads"] == 8


def test_show_mixtral_json_total_and_active(run_cli) -> None:
    data = ok_json(run_cli, ["show", "mixtral-8x7b", "--json"])
    assert data["num_params_total"] == pytest.approx(46.7e9, rel=0.01)  # Mistral AI: 46.7B total
    assert data["num_params_active"] == pytest.approx(12.9e9, rel=0.01)  # 12.9B per token
    assert data["moe"]["num_experts"] == 8 and data["moe"]["top_k"] == 2


def test_show_shorthand_json_per_type_totals(run_cli) -> None:
    data = ok_json(run_cli, ["show", "a100-80g:64,v100-32g:32@roce", "--json"])
    assert data["gpus_per_type"] == {"a100-80g": 64, "v100-32g": 32}
    assert data["gpus_per_island"] == {"main": 64, "roce": 32}
    assert data["total_gpus"] == 96 and data["gpu_types_without_bf16"] == ["v100-32g"]
    assert [(t["gpu"], t["num_gpus"]) for t in data["types"]] == [("a100-80g", 64), ("v100-32g", 32)]


@pytest.mark.parametrize("name", cluster_names())
def test_show_every_catalog_cluster_prints_per_type_totals(run_cli, name: str) -> None:
    data = ok_json(run_cli, ["show", name, "--json"])
    assert data["kind"] == "cluster" and data["name"] == name
    assert sum(data["gpus_per_type"].values()) == data["total_gpus"] >= 16
    code, out, _ = run_cli(["show", name])
    assert code == 0 and "Per GPU type" in out and str(data["total_gpus"]) in out


@pytest.mark.parametrize("cfg,ref", [(LLAMA3_8B, "llama3-8b"), (MIXTRAL_8X7B, "mixtral-8x7b")])
def test_show_hf_config_path(run_cli, tmp_path: Path, cfg: dict, ref: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    data = ok_json(run_cli, ["show", str(path), "--json"])
    spec = load_model(ref)
    assert (data["num_params_total"], data["num_params_active"]) == (spec.num_params_total, spec.num_params_active)
    code, out, _ = run_cli(["show", str(path)])
    assert code == 0 and "parameters (total)" in out


def test_show_gpu_and_tables(run_cli) -> None:
    data = ok_json(run_cli, ["show", "h100-80g", "--json"])
    assert data["kind"] == "gpu" and data["spec"]["bf16_tflops"] == 989.4
    assert data["default_node"]["nic_bandwidth_gbps"] == 400
    code, out, _ = run_cli(["show", "mixtral-8x7b"])
    assert code == 0 and "46.70B" in out and "12.88B" in out


def test_catalog_tables_and_json(run_cli) -> None:
    code, out, _ = run_cli(["catalog"])
    assert code == 0
    for name in ("llama3-405b", "mi300x-192g", "hetero3-4096"):
        assert name in out
    data = ok_json(run_cli, ["catalog", "--json"])
    assert [m["name"] for m in data["models"]] == model_names()
    assert [g["name"] for g in data["gpus"]] == gpu_names()
    assert {c["name"]: c["total_gpus"] for c in data["clusters"]}["hetero3-1024"] == 1024
    assert list(ok_json(run_cli, ["catalog", "gpus", "--json"])) == ["gpus"]


@pytest.mark.parametrize("kind", ["model", "cluster", "gpu", "training", "plan", "result", "options"])
def test_schema_each_kind(run_cli, kind: str) -> None:
    schema = ok_json(run_cli, ["schema", kind, "--json"])
    assert schema["type"] == "object" and schema["properties"]


def test_cluster_schema_documents_the_file_conveniences(run_cli) -> None:
    schema = ok_json(run_cli, ["schema", "cluster"])
    node = schema["$defs"]["NodeGroup"]["properties"]
    assert "num_gpus" in node and any(alt.get("type") == "string" for alt in node["gpu"]["anyOf"])


def test_validate_reports_kind(run_cli, tmp_path: Path) -> None:
    model = tmp_path / "m.yaml"
    model.write_text("base: llama3-8b\nnum_layers: 8\n")
    code, out, err = run_cli(["validate", str(model)])
    assert code == 0 and "valid model" in out, err
    cluster = tmp_path / "c.yaml"
    cluster.write_text("node_groups:\n  - {gpu: l40s-48g, num_nodes: 2}\n")
    data = ok_json(run_cli, ["validate", str(cluster), "--json"])
    assert data["kind"] == "cluster" and data["summary"]["gpus_per_type"] == {"l40s-48g": 16}


def test_validate_knows_network_profile_and_prices_files(run_cli, tmp_path: Path) -> None:
    """The three input kinds `schema` documents beside the others are recognised (they were "cannot tell what ...
    describes"), and a broken one of each exits 2 in one paragraph."""
    net = tmp_path / "n.yaml"
    net.write_text("kind: network\nname: t\nlinks:\n- link: inter_node\n  gpu_types: [a100-80g]\n  per: node_nic\n  curve:\n"
                   "    kind: table\n    points:\n    - {message_bytes: 1.0e6, bandwidth_gbps: 10}\n"
                   "    - {message_bytes: 1.0e8, bandwidth_gbps: 100}\n")
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"haap_profile": 1, "entries": [{"gpu": "a100-80g", "tp": 1, "mbs": m,
                                                                  "layer_time_ms": 5.0} for m in (1, 2)]}))
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpus:\n  a100-80g: {on_demand_usd_per_gpu_hour: 2.5, tdp_w: 400}\n")
    for path, kind, needle in ((net, "network", "1 measured link"), (prof, "profile", "2 measured point"),
                               (prices, "prices file", "over the catalog")):
        code, out, err = run_cli(["validate", str(path)])
        assert code == 0 and f"valid {kind}" in out and needle in out, err
    assert ok_json(run_cli, ["validate", str(prof), "--json"])["summary"]["spec"]["points"] == 2
    metis = Path(__file__).parent / "data" / "profiles" / "OPT-350"  # (a Metis folder, as --profile takes it)
    code, out, err = run_cli(["validate", str(metis)])
    assert code == 0 and "valid profile" in out, err
    prices.write_text("gpus:\n  a100-80g: {on_demand_usd_per_gpu_hour: 1}\nprovder: x\n")  # (a misspelled key)
    code, _, err = run_cli(["validate", str(prices)])
    assert code == 2 and "unknown key 'provder'" in err, err
    prices.write_text("gpus:\n  a100-80g: {on_demand_usd_per_gpu_hour: -1}\n")
    net.write_text("kind: network\nlinks: 3\n")
    for path in (net, prices):
        code, _, err = run_cli(["validate", str(path)])
        assert code == 2 and err.startswith("error: ") and "Traceback" not in err, err


@pytest.mark.parametrize("args,needle", [
    (["show", "llama3-80b"], "did you mean"),
    (["show", "a100-80g:60"], "multiple of GPUs per node"),
    (["show", "/no/such/file.yaml"], "does not exist"),
    (["catalog", "pets"], "unknown catalog 'pets'"),
    (["schema", "pets"], "unknown schema 'pets'"),
    (["validate", "/"], "is a directory"),
])
def test_errors_are_one_paragraph_exit_2(run_cli, args: list[str], needle: str) -> None:
    code, out, err = run_cli(args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and needle in err
    assert err.strip().count("\n") == 0 and "Traceback" not in err


@pytest.mark.parametrize("content", [b"\x00\xff\x00", b"\xff\xfe bad", b"num_layers: [\n", b"hidden: 5\n"])
def test_validate_bad_files_exit_2(run_cli, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    code, _, err = run_cli(["validate", str(path)])
    assert code == 2 and err.startswith("error: ") and err.strip().count("\n") == 0


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["plan"].update(model="gpt3-2.7b"), "the plan says model 'gpt3-2.7b'"),
    (lambda d: d["training"].update(gbs=0), "field training.gbs"),
    (lambda d: d["model"].update(num_layers=-1), "field model.num_layers"),
    (lambda d: d.update(training=[1]), "field 'training' must be a training mapping"),
    (lambda d: d.update(model=5), "field 'model' must be a model mapping"),
])
def test_validate_refuses_a_result_the_plan_commands_refuse(run_cli, tmp_path: Path, edit, needle) -> None:
    """validate said OK to a result file that estimate/simulate/emit refuse (a plan for another model, a bad
    embedded model or training): it swallowed the plan reader's error. Same message, exit 2, now."""
    code, out, err = run_cli(["solve", "-m", "gpt3-1.3b", "-c", "h100-80g:8", "--solver", "uniform", "--gbs", "16",
                              "--json", "-"])
    assert code == 0, err
    doc = json.loads(out)
    edit(doc)
    f = tmp_path / "r.json"
    f.write_text(json.dumps(doc))
    for args in (["validate", str(f)], ["estimate", "--plan", str(f)]):
        code, out, err = run_cli(args)
        assert code == 2 and needle in err and "Traceback" not in err, (args, out, err)
    doc.update(plan=None, status="INFEASIBLE")  # a result without a plan stays valid
    f.write_text(json.dumps(doc))
    code, out, err = run_cli(["validate", str(f)])
    assert code == 0 and "INFEASIBLE" in out, err
