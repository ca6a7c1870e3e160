"""Plans the search finds with cp > 1 and etp > 1, emitted for the engines and validated by their own code where it
is installed (Megatron-Core's TransformerConfig / ModelParallelConfig, torchtitan 0.3.0's ConfigManager);
FlagScale refuses cp with the reason and torchtitan refuses etp (its 0.3.0 config has no expert-tensor degree)."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_emit_engine_validators import _mcore, transformer_config_kwargs

from haap_milp import planner
from haap_milp.catalog import load_cluster, load_model
from haap_milp.emit import EmitError, emit
from haap_milp.emit.megatron import build_args
from haap_milp.emit.megatron_rules import parse_argv, validate_megatron_args
from haap_milp.specs import SolveOptions, TrainingSpec


@pytest.fixture(scope="module")
def cp_plan():
    """llama3-8b at 128k tokens on 16 H100, --target megatron --cp auto."""
    model, cluster = load_model("llama3-8b"), load_cluster("h100-80g:16")
    training = TrainingSpec(global_batch_size=16, seq_len=131072)
    out = planner.solve(model, cluster, training, SolveOptions(time_limit_s=30, target="megatron", cp="auto"))
    assert out.result.plan is not None and out.result.plan.cp > 1 and out.violations == []
    return out.result.plan, model, cluster


@pytest.fixture(scope="module")
def etp_plan():
    """Mixtral-8x7B on 16 H100 (4 layers, one stage: ep <= 8 experts, so etp 2 halves each GPU's expert)."""
    model = load_model("mixtral-8x7b").model_copy(update={"num_layers": 4})
    cluster = load_cluster("h100-80g:16")
    training = TrainingSpec(global_batch_size=32, seq_len=4096)
    opts = SolveOptions(time_limit_s=30, target="megatron", etp="auto", micro_batch_sizes=(16,), max_stages=2,
                        recompute=("none",))
    out = planner.solve(model, cluster, training, opts)
    assert out.result.plan is not None and out.violations == []
    assert all(s.etp > 1 for s in out.result.plan.stages)
    return out.result.plan, model, cluster


def test_megatron_gets_context_parallel_size(cp_plan):
    plan, model, cluster = cp_plan
    argv = build_args(plan, model)
    a = parse_argv(argv)
    assert int(a["context_parallel_size"]) == plan.cp
    world = sum(s.num_gpus for s in plan.stages) * plan.cp
    assert validate_megatron_args(argv, world) == []
    assert emit(plan, "megatron", cluster, model)  # the emitter accepts it (plan_violations empty)


def test_megatron_gets_expert_tensor_parallel_size(etp_plan):
    plan, model, _cluster = etp_plan
    argv = build_args(plan, model)
    a = parse_argv(argv)
    assert int(a["expert_tensor_parallel_size"]) == plan.stages[0].etp
    world = sum(s.num_gpus for s in plan.stages) * plan.cp
    assert validate_megatron_args(argv, world) == []


@pytest.mark.parametrize("which", ["cp", "etp"])
def test_megatron_core_config_accepts_cp_and_etp(which, cp_plan, etp_plan):
    torch, F, TransformerConfig = _mcore()
    plan, model, _ = cp_plan if which == "cp" else etp_plan
    cfg = TransformerConfig(**transformer_config_kwargs(build_args(plan, model), torch, F, TransformerConfig))
    if which == "cp":
        assert cfg.context_parallel_size == plan.cp > 1
    else:
        assert cfg.expert_tensor_parallel_size == plan.stages[0].etp > 1
        assert cfg.expert_model_parallel_size == plan.stages[0].ep


def test_flagscale_refuses_cp_and_torchtitan_refuses_etp(cp_plan, etp_plan):
    plan, model, cluster = cp_plan
    with pytest.raises(EmitError, match="context parallelism"):
        emit(plan, "flagscale", cluster, model)
    plan, model, cluster = etp_plan
    with pytest.raises(EmitError, match="expert tensor parallelism"):
        emit(plan, "torchtitan", cluster, model)


def test_torchtitan_accepts_a_cp_plan(cp_plan, tmp_path, monkeypatch):
    """torchtitan 0.3.0 runs context parallelism (parallelism.context_parallel_degree, headtail load balancer)."""
    try:
        import torchtitan.models.llama3.config_registry  # noqa: F401
        from test_emit_torchtitan_engine import _launch_argv
        from torchtitan.config import ConfigManager
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"torchtitan 0.3.0 not importable ({type(exc).__name__})")
    plan, model, cluster = cp_plan
    files = emit(plan, "torchtitan", cluster, model)
    (tmp_path / "haap_tt_cp.py").write_text(files["haap_torchtitan.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = ConfigManager().parse_args(["--module", "haap_tt_cp", "--config", "haap_plan", *_launch_argv(files, tmp_path)])
    assert cfg.parallelism.context_parallel_degree == plan.cp > 1
    assert cfg.training.seq_len == plan.seq_len
