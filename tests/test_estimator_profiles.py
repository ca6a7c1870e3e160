"""Profiles: real Metis-format OPT-350 / GPT-Neo-2.7 profiles (Sailor, MIT) and the native format."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator, load_metis_dir, load_profile
from haap_milp.estimator.profiles import to_native
from haap_milp.specs import ClusterSpec, GPUSpec, ModelSpec, NodeGroup, TrainingSpec

PROFILES = Path(__file__).parent / "data" / "profiles"
A100_40 = GPUSpec(name="a100-40g", memory_gib=40, bf16_tflops=312, fp16_tflops=312, hbm_bandwidth_gbps=1555,
                  intra_node_bandwidth_gbps=300)
V100_16 = GPUSpec(name="v100-16g", memory_gib=16, fp16_tflops=125, hbm_bandwidth_gbps=900, intra_node_bandwidth_gbps=150)
OPT = ModelSpec(name="opt-350m", num_layers=24, hidden=1024, ffn_hidden=4096, num_heads=16, vocab_size=50272,
                activation="relu", seq_len=2048)
CLUSTER = ClusterSpec(name="sailor", node_groups=(
    NodeGroup(gpu=A100_40, num_nodes=2, gpus_per_node=4, nic_bandwidth_gbps=2.3),
    NodeGroup(gpu=V100_16, num_nodes=2, gpus_per_node=4, nic_bandwidth_gbps=1.6)))
TRAIN = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")


def _raw(model: str, dev: str, tp: int, bs: int) -> dict:
    return json.loads((PROFILES / model / f"DeviceType.{dev}_tp{tp}_bs{bs}.json").read_text())


def test_metis_directories_load_with_the_default_device_map():
    opt = load_metis_dir(PROFILES / "OPT-350")
    neo = load_metis_dir(PROFILES / "GPT-Neo-2.7")
    assert opt.num_layers == 24 and neo.num_layers == 32
    assert len(opt.entries) == 23 and len(neo.entries) == 23  # V100 tp1 has no bs8
    raw = _raw("OPT-350", "A100", 2, 4)["execution_time"]["layer_compute_total_ms"]
    e = opt.entries[("a100-40g", 2, 4)]
    assert e.layer_time_s == pytest.approx(sum(raw[1:-1]) / 24 / 1e3)
    assert e.embedding_time_s == pytest.approx(raw[0] / 1e3) and e.head_time_s == pytest.approx(raw[-1] / 1e3)
    # physics in the measurements: V100 slower than A100, bigger micro-batch takes longer
    assert opt.entries[("v100-16g", 1, 2)].layer_time_s > opt.entries[("a100-40g", 1, 2)].layer_time_s
    assert opt.entries[("a100-40g", 1, 8)].layer_time_s > opt.entries[("a100-40g", 1, 1)].layer_time_s


def test_user_device_map_overrides_defaults():
    prof = load_metis_dir(PROFILES / "OPT-350", {"A100": "a100-80g"})
    assert ("a100-80g", 1, 1) in prof.entries and ("a100-40g", 1, 1) not in prof.entries


def test_lookup_interpolates_between_measured_micro_batches():
    prof = load_metis_dir(PROFILES / "OPT-350")
    e2, e4 = prof.entries[("a100-40g", 1, 2)], prof.entries[("a100-40g", 1, 4)]
    mid = prof.lookup("a100-40g", 1, 3)
    assert mid.layer_time_s == pytest.approx((e2.layer_time_s + e4.layer_time_s) / 2)
    assert prof.lookup("a100-40g", 1, 16) is None and prof.lookup("a100-40g", 3, 1) is None


def test_profile_overrides_layer_time_and_memory():
    prof = load_metis_dir(PROFILES / "OPT-350")
    est = Estimator(OPT, CLUSTER, TRAIN, profile=prof)
    plain = Estimator(OPT, CLUSTER, TRAIN)
    lc = est.layer_cost("a100-40g", 2, 2, 1, 1, "none", 8)  # per-replica micro-batch 4
    assert lc.time_s == pytest.approx(prof.entries[("a100-40g", 2, 4)].layer_time_s)
    static, per_sample = prof.memory_split("a100-40g", 2)
    assert lc.static_bytes == pytest.approx(static) and lc.act_bytes == pytest.approx(per_sample * 4)
    assert est.first_stage_extra("a100-40g", 2, 2, 1, 1, "none", 8).time_s == pytest.approx(
        prof.entries[("a100-40g", 2, 4)].embedding_time_s)
    # full recompute scales the measured time by the analytic ratio
    full = est.layer_cost("a100-40g", 2, 2, 1, 1, "full", 8)
    ratio = plain.layer_cost("a100-40g", 2, 2, 1, 1, "full", 8).time_s / plain.layer_cost(
        "a100-40g", 2, 2, 1, 1, "none", 8).time_s
    assert full.time_s == pytest.approx(lc.time_s * ratio)
    # not covered (micro-batch 16): refused by default, analytic only with the analytic fallback
    with pytest.raises(HaapInputError, match="micro-batch 16 is not measured.*--profile-fallback analytic"):
        est.layer_cost("a100-40g", 2, 1, 1, 1, "none", 16)
    loose = Estimator(OPT, CLUSTER, TRAIN, profile=replace(prof, fallback="analytic"))
    assert loose.layer_cost("a100-40g", 2, 1, 1, 1, "none", 16) == plain.layer_cost("a100-40g", 2, 1, 1, 1, "none", 16)


def test_native_format_round_trip(tmp_path):
    prof = load_metis_dir(PROFILES / "GPT-Neo-2.7")
    path = tmp_path / "neo.yaml"
    path.write_text(yaml.safe_dump(to_native(prof)))
    back = load_profile(path)
    assert set(back.entries) == set(prof.entries)
    for k, e in prof.entries.items():
        assert back.entries[k].layer_time_s == pytest.approx(e.layer_time_s)
        assert back.entries[k].layer_memory_bytes == pytest.approx(e.layer_memory_bytes)


def test_profile_errors(tmp_path):
    with pytest.raises(HaapInputError, match="no Metis profile files"):
        load_metis_dir(tmp_path)
    shutil.copy(PROFILES / "OPT-350" / "DeviceType.A100_tp1_bs1.json", tmp_path / "DeviceType.TPU_tp1_bs1.json")
    with pytest.raises(HaapInputError, match="TPU"):
        load_metis_dir(tmp_path)
    bad = tmp_path / "p.yaml"
    bad.write_text("entries:\n  - {gpu: a100-40g, tp: 1, mbs: 1}\n")
    with pytest.raises(HaapInputError, match="layer_time_ms"):
        load_profile(bad)
    bad.write_text("seq_len: 4096\nentries:\n  - {gpu: a100-40g, tp: 1, mbs: 1, layer_time_ms: 3}\n")
    with pytest.raises(HaapInputError, match="seq_len"):
        Estimator(OPT, CLUSTER, TRAIN, profile=load_profile(bad))
