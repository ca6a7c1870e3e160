"""Hostile inputs found by the third fuzz pass (each one class of defect, fixed in its loader or validator):
islands and node groups beyond any real cluster (the pairwise link check was quartic: 100 000 shorthand
islands never returned), YAML files large enough to take minutes in PyYAML, true/false read as 1/0 in number
fields, ``network import`` reading /dev/zero forever and printing pydantic's text for ``--name ''``, and
profile times large enough to turn the iteration's $ and J figures into a traceback. In-process, < 3 s.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from conftest import invoke_cli

from haap_milp.catalog import load_cluster
from haap_milp.catalog.files import MAX_YAML_BYTES, parse_text
from haap_milp.errors import HaapInputError
from haap_milp.specs.cluster import MAX_ISLANDS, MAX_NODE_GROUPS

NCCL = Path(__file__).parent / "data" / "nccl_tests" / "all_reduce_perf_1node_a100.txt"


def refused(args: list[str], seconds: float = 30.0) -> str:  # a hang guard, not a timing test
    t0 = time.perf_counter()
    code, out, err = invoke_cli([str(a) for a in args])
    assert code == 2, (args, code, (out + err)[-600:])
    assert "error:" in err and "Traceback" not in out + err and "pydantic" not in err and "[type=" not in err, err
    assert time.perf_counter() - t0 < seconds, args
    return err


@pytest.mark.parametrize("n,needle", [(100_000, f"at most {MAX_NODE_GROUPS}"), (MAX_ISLANDS + 1, f"at most {MAX_ISLANDS}")])
def test_shorthand_with_too_many_islands_is_refused_at_once(n, needle):
    text = ",".join(f"a100-80g:8@i{k}" for k in range(n))
    t0 = time.perf_counter()
    with pytest.raises(HaapInputError, match=needle):
        load_cluster(text)
    assert time.perf_counter() - t0 < 10.0  # was minutes (quartic link check)


def test_shorthand_at_the_island_bound_loads():
    c = load_cluster(",".join(f"a100-80g:8@i{k}" for k in range(MAX_ISLANDS)))
    assert len(c.islands) == MAX_ISLANDS and c.island_link("i0", f"i{MAX_ISLANDS - 1}") is not None


def test_cluster_file_with_too_many_islands_is_refused(tmp_path):
    f = tmp_path / "c.yaml"  # 500 islands, no links: 125 000 pairs, each a scan
    f.write_text(yaml.safe_dump({"node_groups": [{"gpu": "a100-80g", "num_nodes": 1, "island": f"i{k}"}
                                                 for k in range(500)]}))
    assert "500 islands" in refused(["validate", f])


def test_large_yaml_is_refused_before_parsing(tmp_path):
    f = tmp_path / "big.yaml"
    line = "- {gpu: a100-80g, num_nodes: 1}\n"
    f.write_text("node_groups:\n" + line * (MAX_YAML_BYTES // len(line) + 1))
    err = refused(["validate", f], seconds=15.0)
    assert "bytes of YAML" in err
    assert parse_text("a: [1, 2]\n", "x.yaml", "yaml") == {"a": [1, 2]}


@pytest.mark.parametrize("kind,doc,field", [
    ("model", {"name": "m", "num_layers": True, "hidden": 2048, "ffn_hidden": 8192, "num_heads": 16,
               "vocab_size": 32000}, "'num_layers' is true"),
    ("cluster", {"node_groups": [{"gpu": "a100-80g", "num_nodes": True}]}, "'node_groups.0.num_nodes' is true"),
])
def test_true_is_not_a_number(tmp_path, kind, doc, field):
    f = tmp_path / f"{kind}.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert field in refused(["validate", f])


def test_true_is_not_a_number_in_a_plan(tmp_path):
    code, out, err = invoke_cli(["solve", "-m", "gpt3-1.3b", "-c", "h100-80g:8", "--solver", "uniform", "--gbs", "16",
                                 "--json", "-"])
    assert code == 0, err
    doc = json.loads(out)
    doc["plan"]["stages"][0]["tp"] = True
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(doc))
    for args in (["validate", f], ["estimate", "--plan", f], ["simulate", f]):
        assert "stages.0.tp is true" in refused(args).replace("'", "")


def test_network_import_refuses_devices_fifos_and_bad_names(tmp_path):
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    for f in ("/dev/zero", fifo, tmp_path):
        assert "nccl-tests file" in refused(["network", "import", "--format", "nccl-tests", f])
        refused(["network", "import", "--format", "sailor", f])
    assert "--name ''" in refused(["network", "import", "--format", "nccl-tests", NCCL, "--name", ""])
    nan = tmp_path / "s.json"
    nan.write_text('{"zone": {"a": NaN}}')
    assert "nan" in refused(["network", "import", "--format", "sailor", nan])


def test_absurd_profile_times_are_refused(tmp_path):
    pt = {"layer_kind": "decoder", "gpu_type": "h100-80g", "tp": 1, "micro_batch": 1, "seq_len": 4096,
          "precision": "bf16", "forward_s": 1e308, "backward_s": 2e-3, "peak_memory_bytes": 2**28, "repeats": 5}
    doc = {"format": "haap-profile", "version": 2,
           "header": {"model": {"name": "gpt3-1.3b", "num_layers": 24, "hidden": 2048, "ffn_hidden": 8192,
                                "num_heads": 16, "num_kv_heads": 16, "vocab_size": 50257, "activation": "gelu"},
                      "device": {"name": "x", "kind": "other", "gpu_type": "h100-80g"},
                      "created": "2026-11-30T00:00:00+00:00", "tool": "t", "memory_method": "external"},
           "points": [pt]}
    f = tmp_path / "p.json"
    for bad, field in ((pt, "forward_s"), (dict(pt, forward_s=1e-3, peak_memory_bytes=10**30), "peak_memory_bytes")):
        f.write_text(json.dumps(dict(doc, points=[bad])))
        err = refused(["estimate", "-m", "gpt3-1.3b", "-c", "h100-80g:8", "--gbs", "8", "--dp", "8", "--profile", f])
        assert f"points.0.{field}" in err, err


EST = ["estimate", "-m", "llama3-8b", "-c", "h100-80g:8", "--tp", "1", "--pp", "1", "--dp", "8", "--mbs", "1",
       "--gbs", "64"]


@pytest.mark.parametrize("flag", ["--network", "--training", "--profile"])
def test_a_path_too_long_for_the_os_names_its_flag(flag):
    """ENAMETOOLONG is not one of the errors pathlib's is_file/is_dir swallow: it was a traceback."""
    err = refused(EST + [flag, "a" * 5000])
    assert flag in err or "profile" in err


@pytest.mark.parametrize("flag", ["--training", "--prices"])
def test_a_file_error_names_its_flag(flag, tmp_path):
    """A device, or a file whose aliases expand past the limit, is refused naming the flag it came in (it said
    "no such file" for --training /dev/zero, and only the path for an alias bomb)."""
    err = refused(EST + [flag, "/dev/zero"])
    assert f"{flag} '/dev/zero' is not a regular file" in err, err
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdef", "bcdefg")))
    err = refused(EST + [flag, bomb])
    assert err.startswith(f"error: {flag}:") and "aliases" in err, err


@pytest.mark.parametrize("args,needle", [
    (["solve", "--max-cost-per-hour", "1e308"], "--max-cost-per-hour"),  # OverflowError in the rate weights
    (["pareto", "--max-cost-per-hour", str(2**63)], "--max-cost-per-hour"),
    (EST + ["--etp", "0"], "--etp"),  # pydantic's text
    (["bench", str(Path(__file__).parent.parent / "benchmarks" / "specs" / "quick.yaml"), "--workers", str(2**63)],
     "--workers"),  # OverflowError, partial folder
])
def test_out_of_range_numbers_name_their_flag(args, needle, tmp_path):
    if args[0] == "bench":
        args = args + ["--out", str(tmp_path / "out")]
    assert needle in refused(args)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs the /dev/full device")
@pytest.mark.parametrize("cmd", [["network", "import", "--format", "nccl-tests", str(NCCL), "-o", "/dev/full"]])
def test_an_output_device_is_written_not_replaced(cmd):
    """`network import -o /dev/full` used its own atomic writer, whose os.replace put a regular file where the device
    was (as root: /dev/full destroyed for every later test). All writers now go through outputs.write_atomic."""
    assert "No space left" in refused(cmd) or "could not be written" in refused(cmd)
    assert Path("/dev/full").is_char_device()


GPU = {"name": "x1", "memory_gib": 80, "bf16_tflops": 300, "hbm_bandwidth_gbps": 2000, "intra_node_bandwidth_gbps": 300}


@pytest.mark.parametrize("group,field", [
    ({"gpu": "a100-80g", "nic_bandwidth_gbps": 1e-15}, "node_groups.0.nic_bandwidth_gbps"),  # fuzz #1: exit 0, OPTIMAL
    ({"gpu": dict(GPU, bf16_tflops=1e300)}, "node_groups.0.gpu.bf16_tflops"),  # fuzz #2: a math domain error
    ({"gpu": dict(GPU, hbm_bandwidth_gbps=1e300)}, "node_groups.0.gpu.hbm_bandwidth_gbps"),  # a division by zero
    ({"gpu": dict(GPU, intra_node_bandwidth_gbps=1e-300)}, "node_groups.0.gpu.intra_node_bandwidth_gbps"),
    ({"gpu": dict(GPU, fp8_tflops=1e-300)}, "node_groups.0.gpu.fp8_tflops"),
])
def test_absurd_link_and_gpu_rates_are_refused(tmp_path, group, field):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"name": "c", "node_groups": [dict(group, num_nodes=2)]}))
    for args in (["validate", f], ["solve", "-m", "gpt3-125m", "-c", f, "--time-limit", "3"]):
        assert f"'{field}'" in refused(args)


def test_slow_but_real_links_and_gpus_load(tmp_path):
    """1 Gb Ethernet (0.125 GB/s), a PCIe-only 0.1 TFLOP/s part, an 8-byte nccl-tests point over a 100 us WAN."""
    c = load_cluster("a100-80g:8")
    f = tmp_path / "c.yaml"
    gpu = dict(GPU, bf16_tflops=0.1, intra_node_bandwidth_gbps=0.25)
    f.write_text(yaml.safe_dump({"name": "c", "node_groups": [{"gpu": gpu, "num_nodes": 2, "nic": "ethernet",
                                                               "nic_bandwidth_gbps": 0.125}]}))
    assert load_cluster(str(f)).node_groups[0].nic_bandwidth_gbps == 0.125
    net = tmp_path / "n.yaml"
    net.write_text(yaml.safe_dump({"links": [{"link": "inter_node", "gpu_types": ["a100-80g"], "per": "node_nic",
                                              "curve": {"kind": "table", "points": [
                                                  {"message_bytes": 8, "bandwidth_gbps": 8e-8},
                                                  {"message_bytes": 1e9, "bandwidth_gbps": 10}]}}]}))
    from haap_milp.network.merge import apply_network_option
    assert apply_network_option(c, net).network.links[0].bandwidth_gbps(8) == 8e-8


def test_a_network_error_names_the_key_as_written_and_nothing_false(tmp_path):
    """Fuzz #1 and #15: a 1e-300 GB/s table point is refused at its key as the file spells it (no 'table' tag), with no
    second clause saying the file's one link is missing ('Tuple should have at least 1 item')."""
    net = tmp_path / "n.yaml"
    net.write_text(yaml.safe_dump({"links": [{"link": "inter_node", "gpu_types": ["a100-80g"], "per": "node_nic",
                                              "curve": {"kind": "table", "points": [
                                                  {"message_bytes": 1e6, "bandwidth_gbps": 1e-300}]}}]}))
    err = refused(["solve", "-m", "gpt3-125m", "-c", "a100-80g:16", "--time-limit", "3", "--network", net])
    assert "'links.0.curve.points.0.bandwidth_gbps' = 1e-300" in err and "Tuple" not in err and "3600 s" in err, err


@pytest.mark.parametrize("text,needle", [
    ("gpus:\n  a100-80g: {idle_w: 500, tdp_w: 100}\n", "gpus.a100-80g.idle_w = 500 W is more than its tdp_w = 100 W"),
    ("gpus:\n  a100-80gb: {idle_w: 500}\n",  # (the catalog's A100 board: 400 W)
     "gpus.a100-80gb.idle_w = 500 W is more than its tdp_w = 400 W (the other from the catalog)"),
    ("gpus:\n  a100-80g: {on_demand_usd_per_gpu_hour: 1e300}\n",
     "= '1e300' is text, not a number: YAML reads this exponent form as a string; write 1.0e+300"),
    ("gpus:\n  a100-80g: {on_demand_usd_per_gpu_hour: '2.5'}\n", "= '2.5' is a quoted number (text); write it without"),
    ("gpus:\n  a100-80g: {on_demand_usd_per_gpu_hour: 'nan'}\n", "= 'nan' must be a number >= 0"),
    ("gpus:\n  a100-80g: {on_demand_usd_per_gpu_hour: 1.0e+300}\n", "is more than 10000"),
    ("", "got an empty file"),
])
def test_a_prices_file_is_checked(tmp_path, text, needle):
    """Fuzz #12: idle power above full-load power, 1e300 read by YAML as text, an empty file ('got NoneType')."""
    f = tmp_path / "p.yaml"
    f.write_text(text)
    err = refused(["solve", "-m", "gpt3-125m", "-c", "a100-80g:8", "--time-limit", "3", "--objective", "energy",
                   "--prices", f])
    assert needle in " ".join(err.split()), err


def test_a_prices_row_for_a_gpu_nobody_has_is_warned_about(tmp_path):
    """Fuzz #12: a GPU name neither the catalog nor the cluster knows (a typo) prices nothing: a stderr warning (a GPU
    defined inline in the cluster file keeps its row, unwarned)."""
    f = tmp_path / "p.yaml"
    f.write_text("gpus:\n  foo-gpu: {on_demand_usd_per_gpu_hour: 3}\n  a100-80gg: {on_demand_usd_per_gpu_hour: 3}\n")
    code, _, err = invoke_cli(["estimate", "-m", "gpt3-125m", "-c", "a100-80g:8", "--gbs", "8", "--dp", "8",
                               "--prices", str(f)])
    assert code == 0 and "warning:" in err and "'foo-gpu'" in err and "did you mean 'a100-80g'" in err, err
    c = tmp_path / "c.yaml"
    c.write_text(yaml.safe_dump({"name": "c", "node_groups": [{"gpu": dict(GPU, name="foo-gpu"), "num_nodes": 1,
                                                               "nic_bandwidth_gbps": 25}]}))
    code, _, err = invoke_cli(["estimate", "-m", "gpt3-125m", "-c", str(c), "--gbs", "8", "--dp", "8",
                               "--prices", str(f)])
    assert code == 0 and "'foo-gpu'" not in err, err
    code, _, err = invoke_cli(["pareto", "-m", "gpt3-125m", "-c", "a100-80g:8", "--time-limit", "5", "--max-points",
                               "1", "--prices", str(f)])  # (pareto and replan warn too)
    assert "warning:" in err and "'foo-gpu'" in err, err


def test_a_yaml_key_given_twice_is_refused_with_both_lines(tmp_path):
    """Fuzz #13: PyYAML keeps the last of two equal keys silently (num_layers 4, then 5: validate said OK)."""
    f = tmp_path / "m.yaml"
    f.write_text("name: tiny\nnum_layers: 4\nhidden: 512\nffn_hidden: 2048\nnum_heads: 8\nvocab_size: 32000\n"
                 "num_layers: 5\n")
    assert "key 'num_layers' is given twice in one mapping, at lines 2 and 7" in refused(["validate", f])
    # a merge key's values may be overridden, and equal keys in different mappings are not duplicates
    doc = parse_text("base: &b {a: 1, b: 2}\nm:\n  <<: *b\n  a: 3\nn: {a: 1}\n", "x.yaml", "yaml")
    assert doc["m"] == {"a": 3, "b": 2} and doc["n"] == {"a": 1}
    j = tmp_path / "m.json"  # (JSON too: json.loads kept the last as well)
    j.write_text('{"base": "llama3-8b", "num_layers": 4, "num_layers": 40}')
    assert "key 'num_layers' is given twice in one object" in refused(["validate", j])
    assert parse_text('{"a": {"k": 1}, "b": {"k": 2}}', "x.json", "json") == {"a": {"k": 1}, "b": {"k": 2}}


def test_moe_without_top_k_says_it_is_missing(tmp_path):
    """Fuzz #13: 'top_k=0 must be between 1 and num_experts=4' named a value the file never wrote."""
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump({"name": "tiny", "num_layers": 4, "hidden": 512, "ffn_hidden": 2048, "num_heads": 8,
                                 "vocab_size": 32000, "num_experts": 4}))
    err = refused(["validate", f])
    assert "num_experts=4 needs top_k" in err and "it is missing" in err and "top_k=0" not in err, err


@pytest.mark.parametrize("entries,needle", [
    ([{"gpu": "a100-80g", "tp": 1.9, "mbs": 1, "layer_time_ms": 5.0}], "entries[0].tp = 1.9 must be a whole number"),
    ([{"gpu": "a100-80g", "tp": 1, "mbs": 1, "layer_time_ms": 5.0},
      {"gpu": "a100-80g", "tp": 1, "mbs": 1, "layer_time_ms": 500}], "entries[1] and entries[0] both measure"),
])
def test_profile_entries_are_whole_and_unique(tmp_path, entries, needle):
    """Fuzz #13: tp 1.9 was truncated to 1; a second entry for one point won silently."""
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"haap_profile": 1, "entries": entries}))
    assert needle in refused(["solve", "-m", "gpt3-125m", "-c", "a100-80g:8", "--seq", "1024", "--time-limit", "3",
                              "--profile", f])


def test_native_profile_point_given_twice_is_refused(tmp_path):
    pt = {"layer_kind": "decoder", "gpu_type": "h100-80g", "tp": 1, "micro_batch": 1, "seq_len": 4096,
          "precision": "bf16", "forward_s": 1e-3, "backward_s": 2e-3, "peak_memory_bytes": 2**28, "repeats": 5}
    doc = {"format": "haap-profile", "version": 2,
           "header": {"model": {"name": "gpt3-1.3b", "num_layers": 24, "hidden": 2048, "ffn_hidden": 8192,
                                "num_heads": 16, "num_kv_heads": 16, "vocab_size": 50257, "activation": "gelu"},
                      "device": {"name": "x", "kind": "other", "gpu_type": "h100-80g"},
                      "created": "2026-11-30T00:00:00+00:00", "tool": "t", "memory_method": "external"},
           "points": [pt, dict(pt, forward_s=5e-3)]}
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    err = refused(["estimate", "-m", "gpt3-1.3b", "-c", "h100-80g:8", "--gbs", "8", "--dp", "8", "--profile", f])
    assert "points[1] measures decoder on h100-80g at tp 1, micro-batch 1" in err, err


def test_robust_accepts_the_whole_range_its_message_states():
    """Fuzz #14: --robust 1000 was refused as 'give a percentage from 0 to 1000'."""
    code, _, err = invoke_cli(["solve", "-m", "gpt3-125m", "-c", "a100-80g:8", "--time-limit", "3", "--robust", "1000"])
    assert code == 0, err
    assert "between 0 and 1000" in refused(["solve", "-m", "gpt3-125m", "-c", "a100-80g:8", "--robust", "1000.5"])


@pytest.mark.parametrize("flag", ["--opt-state-bytes", "--grad-bucket"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_runtime_float_flags_want_a_finite_number(flag, value):
    """Fuzz #16: NaN / inf said 'must be less than or equal to 64' where every other float flag says this."""
    assert f"{flag} {value}: give a finite number" in refused(EST + [flag, value])


def test_memory_headroom_has_one_bound_for_the_flag_and_the_file(tmp_path):
    """Fuzz #20: memory_headroom_fraction 0.95 passed in a training file while --memory-headroom 0.95 was refused."""
    f = tmp_path / "t.yaml"
    f.write_text("memory_headroom_fraction: 0.95\n")
    assert "'memory_headroom_fraction' = 0.95" in refused(EST + ["--training", f])
    assert "--memory-headroom '0.95'" in refused(EST + ["--memory-headroom", "0.95"])
    f.write_text("memory_headroom_fraction: 0.9\n")
    small = ["estimate", "-m", "gpt3-125m", "-c", "h100-80g:8", "--dp", "8", "--gbs", "8", "--seq", "1024"]
    for extra in (["--training", str(f)], ["--memory-headroom", "0.9"]):  # (8 GiB of each H100 left: enough)
        code, _, err = invoke_cli(small + extra)
        assert code == 0, err


def test_cosmetic_messages(tmp_path):
    """Fuzz #21: nested quotes, a doubled 'at', a repr cut mid-string, 'has no a on_demand price'."""
    lst, trunc, cal, nulls = (tmp_path / n for n in ("list.json", "trunc.json", "cal.json", "p.yaml"))
    lst.write_text("[1, 2, 3]")
    trunc.write_text('{"num_layers": 4, "name": "abc')
    cal.write_text(json.dumps({k: 1 for k in ("architectures", "hidden_act", "hidden_size", "intermediate_size",
                                              "num_attention_heads")}))
    nulls.write_text("gpus:\n  a100-80g: {on_demand_usd_per_gpu_hour: null}\n")
    err = refused(["solve", "-m", lst, "-c", "a100-80g:8"])
    assert f"error: model file '{lst}' should be a mapping" in err, err
    assert "Unterminated string starting at line 1" in refused(["solve", "-m", trunc, "-c", "a100-80g:8"])
    err = " ".join(refused(EST + ["--calibration", cal]).split())
    assert "= a mapping of architectures, hidden_act, hidden_size, intermediate_size, ...: needs" in err, err
    err = refused(["solve", "-m", "gpt3-125m", "-c", "a100-80g:8", "--objective", "cost", "--prices", nulls])
    assert "a100-80g has no on-demand price" in err, err
