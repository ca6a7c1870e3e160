"""`haap-solve profile` on CPU with real torch and real timing: structure, deterministic memory monotonicity,
a work-scaling timing check built not to flake, and the round trip into `estimate`. Never speed."""

from __future__ import annotations

import importlib.util
import json

import pytest

from haap_milp.estimator import Estimator, load_profile
from haap_milp.estimator.profile_format import NativeProfile, read_native

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="PyTorch not installed (pip install 'haap-milp[profile]')")
TINY = "name: tiny\nnum_layers: 4\nhidden: 64\nffn_hidden: 128\nnum_heads: 2\nvocab_size: 128\nseq_len: 32\n"
# big enough that one decoder layer at micro-batch 1 is milliseconds of matrix work, not Python overhead
SMALL = ("name: small\nnum_layers: 2\nhidden: 256\nffn_hidden: 1024\nnum_heads: 4\nvocab_size: 256\nseq_len: 128\n"
         "activation: gelu\n")


@pytest.fixture
def one_thread():
    """One intra-op thread: on a loaded 2-core machine OpenMP spin-waits turn into millisecond stalls."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(tmp_path, text: str, name: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def _check_against_schema(doc: dict, schema: dict) -> None:
    """The JSON keys, required keys and enums of the written file against `haap-solve schema profile`."""
    defs = schema["$defs"]

    def check(obj: dict, sch: dict) -> None:
        assert set(obj) <= set(sch["properties"]), set(obj) - set(sch["properties"])
        assert set(sch.get("required", ())) <= set(obj)
        for k, v in obj.items():
            prop = sch["properties"][k]
            if "enum" in prop:
                assert v in prop["enum"]
            ref = prop.get("$ref")
            if ref and isinstance(v, dict):
                check(v, defs[ref.rsplit("/", 1)[1]])

    check(doc, schema)
    for p in doc["points"]:
        check(p, defs["ProfilePoint"])


@needs_torch
def test_profile_tiny_model_structure_and_round_trip(tmp_path, run_cli, one_thread):
    model, out = _model(tmp_path, TINY, "tiny"), tmp_path / "prof.json"
    code, stdout, err = run_cli(["profile", "-m", model, "--device", "cpu", "--gpu-type", "a100-80g",
                                 "--micro-batches", "1,2", "--repeats", "2", "--warmup", "1", "-o", str(out)])
    assert code == 0, err
    assert "wrote" in stdout and not list(tmp_path.glob(".prof.json.*"))  # atomic write left no temp file
    doc = json.loads(out.read_text())
    code, schema_out, _ = run_cli(["schema", "profile"])
    _check_against_schema(doc, json.loads(schema_out))
    prof = NativeProfile.model_validate(doc)
    assert prof.header.device.kind == "cpu" and prof.header.device.torch_version
    assert prof.header.memory_method == "cpu_tensor_bytes" and prof.header.model.hidden == 64
    assert [(p.layer_kind, p.micro_batch) for p in prof.points] == [
        ("embedding", 1), ("decoder", 1), ("head", 1), ("embedding", 2), ("decoder", 2), ("head", 2)]
    for p in prof.points:
        assert not p.out_of_memory and p.repeats == 2 and p.seq_len == 32 and p.precision == "bf16"
        assert p.forward_s > 0 and p.backward_s > 0 and p.optimizer_s > 0
        assert p.spread["forward"].min_s <= p.forward_s <= p.spread["forward"].max_s
    # counted tensor bytes are deterministic: activations grow with the micro-batch
    mem = {(p.layer_kind, p.micro_batch): p.peak_memory_bytes for p in prof.points}
    for kind in ("embedding", "decoder", "head"):
        assert mem[(kind, 2)] > mem[(kind, 1)] > 0
    # round trip: Python API and `estimate --profile`
    loaded = load_profile(out, precision="bf16")
    assert loaded.meta["covered_keys"] == {("a100-80g", 1, 1, "bf16"), ("a100-80g", 1, 2, "bf16")}
    dec = next(p for p in prof.points if p.layer_kind == "decoder" and p.micro_batch == 2)
    assert loaded.entries[("a100-80g", 1, 2)].layer_time_s == pytest.approx(dec.forward_s + dec.backward_s)
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.specs import TrainingSpec

    m, c, t = load_model(model), load_cluster("a100-80g:1/1"), TrainingSpec(global_batch_size=8, seq_len=32)
    assert Estimator(m, c, t, profile=loaded).layer_cost("a100-80g", 1, 1, 1, 1, "none", 2).time_s == \
        pytest.approx(dec.forward_s + dec.backward_s)
    args = ["estimate", "-m", model, "-c", "a100-80g:1/1", "--gbs", "8", "--seq", "32", "--mbs", "2", "--json"]
    code, plain, err = run_cli(args)
    assert code == 0, err
    code, measured, err = run_cli([*args, "--profile", str(out)])
    assert code == 0, err
    assert json.loads(measured)["iteration_time_s"] != pytest.approx(json.loads(plain)["iteration_time_s"])


@needs_torch
def test_decoder_time_grows_with_micro_batch(tmp_path, one_thread):
    """16x the work at micro-batch 16. The fastest of the repeats is compared: noise (preemption, other
    processes) only adds time, so the mbs-16 minimum is at least its true time, and the mbs-1 minimum would
    have to be inflated 16-fold in every repeat to reach it."""
    from haap_milp import profiling
    from haap_milp.catalog import load_model

    req = profiling.Request(model=load_model(_model(tmp_path, SMALL, "small")), layers=("decoder",),
                            micro_batches=(1, 16), precisions=("fp32",), tps=(1,), seq_len=128, device="cpu",
                            gpu_type="a100-80g", warmup=1, repeats=3)
    p1, p16 = profiling.run(req).points
    for phase in ("forward", "backward"):
        assert p16.spread[phase].min_s > p1.spread[phase].min_s, phase
    assert p16.peak_memory_bytes > p1.peak_memory_bytes


@needs_torch
def test_out_of_memory_is_recorded_and_carried(tmp_path, monkeypatch, one_thread):
    import torch

    from haap_milp import profiling
    from haap_milp.catalog import load_model
    from haap_milp.profiling import runner

    real = runner.make_inputs

    def oom_above_one(kind, m, tp, micro_batch, *rest):
        if micro_batch > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return real(kind, m, tp, micro_batch, *rest)

    monkeypatch.setattr(runner, "make_inputs", oom_above_one)
    req = profiling.Request(model=load_model(_model(tmp_path, TINY, "tiny")), layers=("decoder",),
                            micro_batches=(1, 4), precisions=("bf16",), tps=(1,), seq_len=32, device="cpu",
                            gpu_type="a100-80g", warmup=0, repeats=1)
    ok, oom = profiling.run(req).points
    assert not ok.out_of_memory and oom.out_of_memory and oom.forward_s is None and "simulated" in oom.note
    path = tmp_path / "p.json"
    profiling.write_atomic(profiling.run(req), path)
    prof = load_profile(path)
    assert prof.meta["oom_keys"] == {("a100-80g", 1, 4, "bf16")} and ("a100-80g", 1, 4) not in prof.entries
    assert read_native(path).points[1].out_of_memory


@needs_torch
@pytest.mark.parametrize(("extra", "message"), [
    (["--tp", "2"], "--tp 2: measuring tensor parallelism needs 2 GPUs"),
    (["--tp", "3"], "--tp 3 must be >= 1 and divide the 2 attention heads"),
    (["--precisions", "fp64"], "--precisions 'fp64'"),
    (["--micro-batches", "1,x"], "--micro-batches '1,x'"),
    (["--layers", "decoder,moe"], "--layers 'decoder,moe'"),
    (["--gpu-type", "b300"], "--gpu-type 'b300' is not a catalog GPU"),
])
def test_profile_user_errors(tmp_path, run_cli, extra, message):
    args = ["profile", "-m", _model(tmp_path, TINY, "tiny"), "--device", "cpu", "-o", str(tmp_path / "x.json")]
    if "--gpu-type" not in extra:
        args += ["--gpu-type", "a100-80g"]
    code, _, err = run_cli([*args, *extra])
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


@needs_torch
def test_cpu_needs_gpu_type(tmp_path, run_cli):
    code, _, err = run_cli(["profile", "-m", _model(tmp_path, TINY, "tiny"), "--device", "cpu"])
    assert code == 2 and "--gpu-type is required with --device cpu" in err


def test_missing_torch_names_the_extra(tmp_path, run_cli, monkeypatch):
    from haap_milp import profiling

    monkeypatch.setattr(profiling, "has_torch", lambda: False)
    code, _, err = run_cli(["profile", "-m", _model(tmp_path, TINY, "tiny"), "--device", "cpu",
                            "--gpu-type", "a100-80g"])
    assert code == 2 and "pip install 'haap-milp[profile]'" in err and "Traceback" not in err


def test_gpu_type_from_driver_names():
    from haap_milp.profiling import gpu_type_from_name

    assert gpu_type_from_name("NVIDIA H100 80GB HBM3") == "h100-80g"
    assert gpu_type_from_name("NVIDIA A100-SXM4-80GB") == "a100-80g"
    assert gpu_type_from_name("NVIDIA H200") == "h200-141g"
    assert gpu_type_from_name("Tesla V100-SXM2-16GB") == "v100-16g"
    assert gpu_type_from_name("NVIDIA L40S") == "l40s-48g"
    assert gpu_type_from_name("Some Unknown Accelerator") is None


@needs_torch
def test_tensor_parallel_points_through_torch_distributed(tmp_path, one_thread):
    """tp 2 in two processes (gloo on CPU: the distributed machinery, not the timing). A tp-2 shard holds half
    the decoder's weights, so its counted memory is smaller than the whole layer's."""
    from haap_milp import profiling
    from haap_milp.catalog import load_model

    req = profiling.Request(model=load_model(_model(tmp_path, TINY, "tiny")), layers=("decoder",),
                            micro_batches=(2,), precisions=("fp32",), tps=(1, 2), seq_len=32, device="cpu",
                            gpu_type="a100-80g", warmup=0, repeats=1, allow_cpu_tp=True)
    result = profiling.run(req)
    one, two = result.points
    assert (one.tp, two.tp) == (1, 2) and two.forward_s > 0 and two.backward_s > 0 and not two.out_of_memory
    assert two.peak_memory_bytes < one.peak_memory_bytes
    assert result.header.device.count == 2
    path = tmp_path / "tp.json"
    profiling.write_atomic(result, path)
    assert load_profile(path).meta["covered_keys"] == {("a100-80g", 1, 2, "fp32"), ("a100-80g", 2, 2, "fp32")}
