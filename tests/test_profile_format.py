"""Native JSON profile format: schema, loader (covered / out-of-memory keys), round trip into `estimate`.

No torch needed: the profiles here are written by hand.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator, load_profile
from haap_milp.estimator.profile_format import UNCOVERED_POLICY, NativeProfile, load_native_json
from haap_milp.specs import ClusterSpec, GPUSpec, ModelSpec, NodeGroup, TrainingSpec

TINY = ModelSpec(name="tiny", num_layers=4, hidden=64, ffn_hidden=128, num_heads=2, vocab_size=128, seq_len=32)
A100 = GPUSpec(name="a100-80g", memory_gib=80, bf16_tflops=312, fp16_tflops=312, hbm_bandwidth_gbps=2039,
               intra_node_bandwidth_gbps=300)
CLUSTER = ClusterSpec(name="one", node_groups=(NodeGroup(gpu=A100, num_nodes=1, gpus_per_node=1, nic_bandwidth_gbps=25),))
TRAIN = TrainingSpec(global_batch_size=8, seq_len=32, precision="bf16")
MIB = 2**20


def _pt(kind: str, mbs: int, fwd: float | None, bwd: float | None, mem: int | None = None, *, prec: str = "bf16",
        oom: bool = False, gpu: str = "a100-80g", seq: int = 32) -> dict:
    d = {"layer_kind": kind, "gpu_type": gpu, "tp": 1, "micro_batch": mbs, "seq_len": seq, "precision": prec,
         "forward_s": fwd, "backward_s": bwd, "optimizer_s": None if oom else 1e-4, "peak_memory_bytes": mem,
         "out_of_memory": oom, "repeats": 0 if oom else 5}
    if not oom:
        d["spread"] = {"forward": {"min_s": fwd * 0.9, "max_s": fwd * 1.2, "iqr_s": fwd * 0.1}}
    return d


def _doc(points: list[dict]) -> dict:
    return {"format": "haap-profile", "version": 2,
            "header": {"model": {"name": "tiny", "num_layers": 4, "hidden": 64, "ffn_hidden": 128, "num_heads": 2,
                                 "num_kv_heads": 2, "vocab_size": 128, "activation": "swiglu"},
                       "device": {"name": "hand-written", "kind": "other", "gpu_type": "a100-80g"},
                       "created": "2026-11-30T00:00:00+00:00", "tool": "a test", "memory_method": "external"},
            "points": points}


HAND = [
    _pt("embedding", 1, 1e-4, 2e-4, 10 * MIB), _pt("decoder", 1, 1e-3, 2e-3, 100 * MIB),
    _pt("head", 1, 5e-4, 1e-3, 20 * MIB),
    _pt("embedding", 2, 2e-4, 4e-4, 12 * MIB), _pt("decoder", 2, 2e-3, 4e-3, 150 * MIB),
    _pt("head", 2, 1e-3, 2e-3, 30 * MIB),
    _pt("decoder", 4, None, None, oom=True),                      # out of memory at mbs 4
    _pt("attention", 8, 3e-3, 6e-3), _pt("mlp", 8, 1e-3, 2e-3),   # parts only at mbs 8
    _pt("decoder", 1, 4e-3, 8e-3, 400 * MIB, prec="fp32"),        # another precision
]


@pytest.fixture
def hand(tmp_path):
    path = tmp_path / "native.json"
    path.write_text(json.dumps(_doc(HAND)))
    return path


def test_loader_covered_and_oom_keys(hand):
    prof = load_native_json(hand, "bf16")
    assert prof.meta["covered_keys"] == {("a100-80g", 1, 1, "bf16"), ("a100-80g", 1, 2, "bf16"),
                                         ("a100-80g", 1, 8, "bf16")}
    assert prof.meta["oom_keys"] == {("a100-80g", 1, 4, "bf16")}
    assert ("a100-80g", 1, 4) not in prof.entries  # never priced from the profile
    e = prof.entries[("a100-80g", 1, 2)]
    assert e.layer_time_s == pytest.approx(6e-3) and e.embedding_time_s == pytest.approx(6e-4)
    assert e.head_time_s == pytest.approx(3e-3) and e.layer_memory_bytes == 150 * MIB
    parts = prof.entries[("a100-80g", 1, 8)]  # decoder time = attention + mlp, memory left to the model
    assert parts.layer_time_s == pytest.approx(12e-3) and parts.layer_memory_bytes is None
    assert prof.seq_len == 32 and prof.num_layers == 4 and prof.meta["precision"] == "bf16"
    assert prof.meta["optimizer_s"][("a100-80g", 1, 1)] == pytest.approx(1e-4)
    assert UNCOVERED_POLICY in prof.meta["notes"]
    # the stated interpolation: linear between measured mbs 1 and 2
    assert prof.lookup("a100-80g", 1, 1.5).layer_time_s == pytest.approx(4.5e-3)
    fp32 = load_native_json(hand, "fp32")
    assert fp32.meta["covered_keys"] == {("a100-80g", 1, 1, "fp32")} and not fp32.meta["oom_keys"]


def test_loader_refuses_ambiguous_or_missing_precision(hand, tmp_path):
    with pytest.raises(HaapInputError, match="several precisions"):
        load_native_json(hand)
    with pytest.raises(HaapInputError, match="no points at precision fp16"):
        load_native_json(hand, "fp16")
    one = tmp_path / "one.json"
    one.write_text(json.dumps(_doc(HAND[:6])))
    assert load_native_json(one).meta["precision"] == "bf16"  # a single precision needs no choice


def test_loader_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc([_pt("decoder", 1, 1e-3, 2e-3, gpu="no-such-gpu")])))
    with pytest.raises(HaapInputError, match="points\\[0\\].gpu_type 'no-such-gpu'"):
        load_native_json(bad)
    doc = _doc([_pt("decoder", 1, 1e-3, 2e-3)])
    doc["points"][0]["forward_s"] = None
    bad.write_text(json.dumps(doc))
    with pytest.raises(HaapInputError, match="needs forward_s and backward_s"):
        load_native_json(bad)


def test_load_profile_dispatches_and_estimator_checks_precision(hand):
    prof = load_profile(hand, precision="bf16")
    est, plain = Estimator(TINY, CLUSTER, TRAIN, profile=prof), Estimator(TINY, CLUSTER, TRAIN)
    lc = est.layer_cost("a100-80g", 1, 1, 1, 1, "none", 2)
    assert lc.time_s == pytest.approx(6e-3) and lc != plain.layer_cost("a100-80g", 1, 1, 1, 1, "none", 2)
    # not covered (mbs 16): refused by default, analytic under the analytic fallback
    with pytest.raises(HaapInputError, match="micro-batch 16 is not measured"):
        est.layer_cost("a100-80g", 1, 1, 1, 1, "none", 16)
    loose = Estimator(TINY, CLUSTER, TRAIN, profile=replace(prof, fallback="analytic"))
    assert loose.layer_cost("a100-80g", 1, 1, 1, 1, "none", 16) == plain.layer_cost("a100-80g", 1, 1, 1, 1, "none", 16)
    with pytest.raises(HaapInputError, match="precision fp32, training uses bf16"):
        Estimator(TINY, CLUSTER, TRAIN, profile=load_profile(hand, precision="fp32"))


def test_estimate_cli_takes_a_native_profile(hand, tmp_path, run_cli):
    model = tmp_path / "tiny.yaml"
    model.write_text("name: tiny\nnum_layers: 4\nhidden: 64\nffn_hidden: 128\nnum_heads: 2\nvocab_size: 128\n"
                     "seq_len: 32\n")
    # --seq given: estimate's default is solve's 4096, not the model's seq_len (issue 12)
    args = ["estimate", "-m", str(model), "-c", "a100-80g:1/1", "--gbs", "8", "--seq", "32", "--mbs", "2", "--json"]
    code, out, err = run_cli(args)
    assert code == 0, err
    code_p, out_p, err_p = run_cli([*args, "--profile", str(hand)])
    assert code_p == 0, err_p
    plain, measured = json.loads(out), json.loads(out_p)
    assert measured["iteration_time_s"] != pytest.approx(plain["iteration_time_s"])
    code, _, err = run_cli([*args, "--precision", "fp16", "--profile", str(hand)])
    assert code == 2 and "no points at precision fp16" in err and "Traceback" not in err


def test_a_profile_of_another_model_exits_2_naming_the_flag_and_the_field(hand, tmp_path, run_cli):
    """A profile's layer times belong to the model it was measured on: another layer count (every format) or
    another shape (a native profile's header) is refused, not priced (OPT-350M's profile on llama3-70b gave MFU
    994 %)."""
    model = tmp_path / "tiny.yaml"
    base = "name: tiny\nnum_layers: 4\nhidden: 64\nffn_hidden: 128\nnum_heads: 2\nvocab_size: 128\nseq_len: 32\n"
    args = ["estimate", "-m", str(model), "-c", "a100-80g:1/1", "--gbs", "8", "--seq", "32", "--mbs", "2",
            "--profile", str(hand)]
    for shape, field in ((base.replace("hidden: 64", "hidden: 128"), "hidden=64"),
                         (base.replace("num_layers: 4", "num_layers: 6"), "num_layers=4")):
        model.write_text(shape)
        code, _, err = run_cli(args)
        assert code == 2 and "--profile" in err and field in err and "Traceback" not in err, err
    code, _, err = run_cli(["solve", "-m", "llama3-8b", "-c", "a100-40g:8/4", "--gbs", "64", "--seq", "2048",
                            "--precision", "fp32", "--profile", "tests/data/profiles/OPT-350", "--time-limit", "2"])
    assert code == 2 and "num_layers=24" in err and "llama3-8b" in err, err


def test_schema_command_prints_the_format(run_cli):
    code, out, _ = run_cli(["schema", "profile"])
    assert code == 0
    schema = json.loads(out)
    point = schema["$defs"]["ProfilePoint"]
    for key in ("layer_kind", "gpu_type", "tp", "micro_batch", "seq_len", "precision", "forward_s", "backward_s",
                "optimizer_s", "peak_memory_bytes", "out_of_memory", "repeats", "spread"):
        assert key in point["properties"]
    assert point["additionalProperties"] is False and schema["properties"]["format"]["const"] == "haap-profile"
    assert NativeProfile.model_validate(_doc(HAND)).points[6].out_of_memory


def test_out_of_memory_points_are_never_priced(hand, tmp_path):
    from haap_milp.estimator import load_profiles
    from haap_milp.estimator.override import coverage

    for fallback in ("none", "interpolate", "analytic"):
        prof = load_profiles([hand], precision="bf16", fallback=fallback)
        assert coverage(prof, "a100-80g", 1, 4) == "oom"
        with pytest.raises(HaapInputError, match="measured out of memory.*a measurement says it does not fit"):
            Estimator(TINY, CLUSTER, TRAIN, profile=prof).layer_cost("a100-80g", 1, 1, 1, 1, "none", 4)
    # another file measuring that point fine contradicts the first: an error naming both
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_doc([_pt("decoder", 4, 1e-3, 2e-3, 100 * MIB)])))
    with pytest.raises(HaapInputError, match=f"profiles '{hand}' and '{other}' disagree on a100-80g at tp 1, "
                                             "micro-batch 4"):
        load_profiles([hand, other], precision="bf16")
    longer = tmp_path / "longer.json"
    longer.write_text(json.dumps(_doc([_pt("decoder", 1, 1e-3, 2e-3, gpu="h100-80g", seq=64)])))
    with pytest.raises(HaapInputError, match="disagree on the seq_len"):
        load_profiles([hand, longer], precision="bf16")
