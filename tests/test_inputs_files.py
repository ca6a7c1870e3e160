"""Model and cluster files (YAML/JSON): what works, and every kind of bad input as one paragraph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from haap_milp.catalog import load_cluster, load_model
from haap_milp.catalog.detect import load_file
from haap_milp.errors import HaapInputError

MODEL_YAML = "num_layers: 4\nhidden: 256\nffn_hidden: 1024\nnum_heads: 8\nvocab_size: 1000\n"
CLUSTER_YAML = """
node_groups:
  - {gpu: h100-80g, num_nodes: 2}
  - {gpu: A100-80G, num_gpus: 32, island: far}
  - gpu: {name: my-gpu, memory_gib: 24, bf16_tflops: 100, hbm_bandwidth_gbps: 900, intra_node_bandwidth_gbps: 32}
    num_nodes: 1
    gpus_per_node: 4
    nic: ethernet
    nic_bandwidth_gbps: 3
    island: far
island_links:
  - {a: main, b: far, bandwidth_gbps: 3.125, latency_us: 80}
"""


def write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def test_model_yaml_and_name_from_file(tmp_path: Path) -> None:
    spec = load_model(write(tmp_path, "tiny.yaml", MODEL_YAML))
    assert spec.name == "tiny" and spec.num_layers == 4 and spec.activation == "swiglu"


def test_model_yaml_over_a_catalog_base(tmp_path: Path) -> None:
    spec = load_model(write(tmp_path, "half.yaml", "base: llama3-8b\nnum_layers: 16\nsource: my notes\n"))
    base = load_model("llama3-8b")
    assert spec.name == "half" and spec.num_layers == 16 and spec.hidden == base.hidden
    per_layer = base.layer_params(0)
    assert base.num_params_total - spec.num_params_total == 16 * per_layer


def test_show_json_round_trips_as_model_and_cluster_files(tmp_path: Path) -> None:
    model = load_model("mixtral-8x7b")
    assert load_model(write(tmp_path, "m.json", model.model_dump_json())) == model
    cluster = load_cluster("a100-v100-islands-96")
    assert load_cluster(write(tmp_path, "c.json", cluster.model_dump_json())) == cluster


def test_cluster_yaml_with_names_defaults_num_gpus_and_inline_gpu(tmp_path: Path) -> None:
    c = load_cluster(write(tmp_path, "lab.yaml", CLUSTER_YAML))
    assert c.name == "lab"
    assert c.gpus_per_type == {"h100-80g": 16, "a100-80g": 32, "my-gpu": 4}
    assert c.gpus_per_island == {"main": 16, "far": 36}
    assert c.node_groups[0].nic_bandwidth_gbps == 400 and c.node_groups[1].num_nodes == 4
    assert c.island_link("far", "main").latency_us == 80


def test_preset_written_as_yaml_gives_the_same_cluster(tmp_path: Path) -> None:
    from haap_milp.catalog.data import catalog

    raw = catalog().clusters["a100-v100-islands-96"]
    path = write(tmp_path, "a100-v100-islands-96.yaml", yaml.safe_dump(raw))
    assert load_cluster(path) == load_cluster("a100-v100-islands-96")


@pytest.mark.parametrize("name,content,needle", [
    ("heads.yaml", MODEL_YAML.replace("num_heads: 8", "num_heads: 7"), "num_heads=7 does not divide hidden=256"),
    ("kv.yaml", MODEL_YAML + "num_kv_heads: 3\n", "num_kv_heads=3 does not divide num_heads=8"),
    ("zero.yaml", MODEL_YAML.replace("num_layers: 4", "num_layers: 0"), "field 'num_layers' = 0"),
    ("neg.yaml", MODEL_YAML.replace("hidden: 256", "hidden: -256"), "field 'hidden' = -256"),
    ("absurd.yaml", "num_layers: 10000\nhidden: 1000000\nffn_hidden: 4000000\nnum_heads: 8\nvocab_size: 10\n",
     "parameters is beyond"),
    ("typo.yaml", MODEL_YAML + "num_layer: 4\n", "unknown key 'num_layer'"),
    ("type.yaml", MODEL_YAML.replace("num_heads: 8", "num_heads: eight"), "field 'num_heads' = 'eight'"),
    ("frac.yaml", MODEL_YAML.replace("num_heads: 8", "num_heads: 8.5"), "field 'num_heads' = 8.5"),
    ("act.yaml", MODEL_YAML + "activation: tanh\n", "field 'activation' = 'tanh'"),
    ("moe.yaml", MODEL_YAML + "num_experts: 4\ntop_k: 5\n", "top_k=5 must be between 1 and num_experts=4"),
    ("nan.yaml", MODEL_YAML + "capacity_factor: .nan\n", "capacity_factor is nan"),
    ("inf.json", '{"num_layers": Infinity}', "num_layers is inf"),
    ("base.yaml", "base: llama9\n", "field 'base' = 'llama9'"),
    ("list.yaml", "- 1\n- 2\n", "should be a mapping"),
    ("empty.yaml", "", "it is empty"),
    ("intkey.yaml", "1: 2\n", "non-text key 1"),
    ("syntax.yaml", "a: [1, 2\n", "not valid YAML"),
    ("syntax.json", '{"a": 1,}', "not valid JSON"),
    ("tab.yaml", "a:\n\t- 1\n", "not valid YAML"),
    ("date.yaml", "num_layers: 2001-02-30\n", "could not be parsed as YAML"),
    ("python.yaml", "!!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ("binary.yaml", b"\x00\x01\x02\x03", "is binary"),
    ("latin1.yaml", "name: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    # a newline in a name ended the comment it is written into (megatron_args.sh) and ran the rest as shell
    ("newline.yaml", MODEL_YAML + 'name: "x\\ntouch /tmp/pwned"\n', "a name must be one line of printable"),
    ("nul.yaml", MODEL_YAML + 'name: "x\\0"\n', "a name must be one line of printable"),
])
def test_bad_model_files(tmp_path: Path, name: str, content: str | bytes, needle: str) -> None:
    with pytest.raises(HaapInputError) as exc:
        load_model(write(tmp_path, name, content))
    assert needle in str(exc.value), str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("content,needle", [
    ("node_groups: []\n", "field 'node_groups' = []"),
    ("name: x\n", "field 'node_groups' is missing"),
    ("node_groups:\n  - {gpu: a100-80g, num_nodes: 0}\n", "field 'node_groups.0.num_nodes' = 0"),
    ("node_groups:\n  - {gpu: a100-80g, num_nodes: 2, colour: red}\n", "unknown key 'node_groups.0.colour'"),
    ("node_groups:\n  - {gpu: a100-81g, num_nodes: 2}\n", "did you mean 'a100-80g'"),
    ("node_groups:\n  - {gpu: 7, num_nodes: 2}\n", "field 'node_groups.0.gpu' = 7"),
    ("node_groups:\n  - {gpu: a100-80g, num_nodes: 2, nic: carrier-pigeon}\n", "field 'node_groups.0.nic'"),
    ("node_groups:\n  - {gpu: a100-80g, num_gpus: 12}\n", "field 'node_groups.0.num_gpus' = 12"),
    ("node_groups:\n  - {gpu: a100-80g, num_gpus: 16, num_nodes: 2}\n", "both num_gpus and num_nodes"),
    # a count past the node limit is said as the num_gpus written (it said num_nodes = 125000000)
    ("node_groups:\n  - {gpu: a100-80g, num_gpus: 1000000000}\n", "field 'node_groups.0.num_gpus' = 1000000000: at most"),
    ("node_groups:\n  - {gpu: a100-80g, num_nodes: 100000, gpus_per_node: 64}\n", "GPUs in total is beyond"),
    ("node_groups:\n  - {gpu: a100-80g, num_nodes: 1, island: a}\n  - {gpu: a100-80g, num_nodes: 1, island: b}\n",
     "islands 'a' and 'b' have no link"),
    ("node_groups:\n  - {gpu: {name: g, memory_gib: 8}, num_nodes: 1}\n", "field 'node_groups.0.gpu.hbm_bandwidth_gbps'"),
    ("node_groups: 3\n", "field 'node_groups' = 3"),
    ('name: "a\\tb"\nnode_groups:\n  - {gpu: a100-80g, num_nodes: 1}\n', "field 'name' = 'a\\tb': a name must be one line"),
    ('node_groups:\n  - {gpu: a100-80g, num_nodes: 1, island: "x\\ny"}\n', "field 'node_groups.0.island'"),
    (("node_groups:\n  - {gpu: a100-80g, num_nodes: 1, island: a}\n  - {gpu: a100-80g, num_nodes: 1, island: b}\n"
     "island_links:\n  - {a: a, b: b, bandwidth_gbps: 10}\n  - {a: b, b: a, bandwidth_gbps: 20}\n"),
     "islands 'b' and 'a' are linked twice (island_links 0 and 1, 10 and 20 GB/s)"),
    (('node_groups:\n  - {gpu: {name: "g\\n", memory_gib: 8, hbm_bandwidth_gbps: 100, intra_node_bandwidth_gbps: 10,'
      ' bf16_tflops: 10}, num_nodes: 1}\n'), "field 'node_groups.0.gpu.name'"),
])
def test_bad_cluster_files(tmp_path: Path, content: str, needle: str) -> None:
    with pytest.raises(HaapInputError) as exc:
        load_cluster(write(tmp_path, "c.yaml", content))
    assert needle in str(exc.value), str(exc.value)
    assert "\n" not in str(exc.value)


def test_wrong_kind_of_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(HaapInputError, match="describes a cluster, not a model"):
        load_model(write(tmp_path, "c.yaml", CLUSTER_YAML))
    with pytest.raises(HaapInputError, match="describes a model, not a cluster"):
        load_cluster(write(tmp_path, "m.yaml", MODEL_YAML))


def test_missing_files_and_directories(tmp_path: Path) -> None:
    with pytest.raises(HaapInputError, match="does not exist"):
        load_model(str(tmp_path / "nope.yaml"))
    with pytest.raises(HaapInputError, match="does not exist"):
        load_cluster(str(tmp_path / "nope.yaml"))
    with pytest.raises(HaapInputError, match="is a directory"):
        load_cluster(str(tmp_path))
    with pytest.raises(HaapInputError, match="is a directory"):
        load_model(str(tmp_path))  # no config.json inside
    with pytest.raises(HaapInputError, match="unknown model 'no-such-model'"):
        load_model("no-such-model")


def test_load_file_detects_each_kind(tmp_path: Path) -> None:
    from haap_milp.specs import Plan, SolveResult, StagePlan, Status

    plan = Plan(model="m", stages=(StagePlan(first_layer=0, num_layers=4, gpu_type="a100-80g", tp=2, dp=2),),
                micro_batch_size=1, num_microbatches=8, global_batch_size=16, seq_len=2048)
    result = SolveResult(status=Status.OPTIMAL, solver="cpsat", objective_s=1.5, plan=plan)
    cases = {"model": write(tmp_path, "m.yaml", MODEL_YAML),
             "cluster": write(tmp_path, "c.yaml", CLUSTER_YAML),
             "training": write(tmp_path, "t.yaml", "global_batch_size: 64\nprecision: fp16\n"),
             "plan": write(tmp_path, "p.json", plan.model_dump_json()),
             "result": write(tmp_path, "r.json", json.dumps(result.model_dump(mode="json")))}
    for kind, path in cases.items():
        assert load_file(path)[0] == kind
    assert load_file(cases["plan"])[1] == plan and load_file(cases["result"])[1] == result
    with pytest.raises(HaapInputError, match="cannot tell what"):
        load_file(write(tmp_path, "x.yaml", "colour: blue\n"))


def test_a_nan_under_a_shared_yaml_alias_is_named_at_its_first_path() -> None:
    """check_finite walks a subtree that YAML aliases share once (an alias-heavy file took one call per expanded
    value); the NaN inside it is still refused, with the first path that reaches it."""
    from haap_milp.catalog.files import parse_text

    levels = "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}' if i else '1.0'] * 6)}]\n" for i in range(6))
    parse_text(levels + "root: [*a5]\n", "ok.yaml", "yaml")  # 6^6 shared leaves, finite: accepted
    with pytest.raises(HaapInputError, match=r"field a0\.x is nan"):
        parse_text("a0: &a0 {x: .nan}\na1: &a1 [*a0, *a0]\nroot: [*a1, *a1]\n", "bad.yaml", "yaml")
