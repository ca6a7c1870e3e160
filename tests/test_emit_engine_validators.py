"""The engines' own validation code on emitted files, where it is published as a package.

* Megatron-LM: ``megatron-core`` (PyPI) holds ``TransformerConfig`` / ``ModelParallelConfig`` whose
  ``__post_init__`` validates the model and parallel settings. Megatron-LM's
  ``megatron/training/arguments.py`` ``core_transformer_config_from_args`` builds it from the parsed
  arguments: every TransformerConfig field from the argument of the same name, plus
  ``layernorm_epsilon = norm_epsilon``, ``num_moe_experts = num_experts``, ``pipeline_dtype = params_dtype``,
  ``--swiglu`` -> ``gated_linear_unit`` + ``F.silu``, ``--disable-bias-linear`` -> ``add_bias_linear=False``
  (store_false). ``argparse``/``validate_args`` live in ``megatron/training`` (not in the package): their
  rules are re-checked in ``haap_milp/emit/megatron_rules.py`` (cited there) and tests/test_emit_megatron.py.
* torchtitan: its config manager (``torchtitan.config.ConfigManager``) imports the whole trainer (triton,
  datasets, tensorboard, ...), too heavy for CI; its rules are re-checked with citations in
  ``haap_milp/emit/torchtitan.py``; the test below runs it when a full torchtitan 0.3.0 install is present.
* FlagScale: not published as a package; rules re-checked in ``haap_milp/emit/flagscale.py``.

Install the validators: ``pip install -e '.[engines]'`` (megatron-core; torch 2.13.0 CPU as in .ci/run).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys

import pytest
from _emit_cases import CASES
from test_emit_catalog import EXPECTED, plan_for

from haap_milp.catalog.data import model_entry
from haap_milp.emit import EmitError, emit
from haap_milp.emit.megatron import build_args
from haap_milp.emit.megatron_rules import parse_argv

# arguments Megatron-LM gives to GPTModel / the training loop, not to TransformerConfig (gpt_builders.py,
# training.py); each is checked elsewhere (choices below, batch rules in megatron_rules.py)
NOT_CONFIG = {"seq_length", "max_position_embeddings", "position_embedding_type", "rotary_base",
              "untie_embeddings_and_output_weights", "micro_batch_size", "global_batch_size",
              "use_distributed_optimizer", "group_query_attention", "fp8_format",
              "num_virtual_stages_per_pipeline_rank"}


def _mcore():
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core not installed (pip install -e '.[engines]')")
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    return torch, F, TransformerConfig


def _scalar(text: str):
    """argparse's type=int / type=float / str for one value."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def transformer_config_kwargs(argv: list[str], torch, F, TransformerConfig) -> dict:
    """``core_transformer_config_from_args`` on the emitted arguments (see the module docstring)."""
    import dataclasses

    a = parse_argv(argv)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw: dict = {}
    for k, v in a.items():
        if k in NOT_CONFIG:
            continue
        if k == "norm_epsilon":
            kw["layernorm_epsilon"] = float(v)
        elif k == "num_experts":
            kw["num_moe_experts"] = int(v)
        elif k == "swiglu":
            kw.update(gated_linear_unit=True, activation_func=F.silu)
        elif k == "disable_bias_linear":
            kw["add_bias_linear"] = False
        elif k == "moe_layer_freq":
            kw[k] = [int(x) for x in str(v).strip("[]").split(",")]  # arguments.py moe_freq_type
        else:
            assert k in fields, f"emitted --{k.replace('_', '-')} is neither a TransformerConfig field nor known"
            kw[k] = v if v is True else _scalar(str(v))
    if a.get("num_virtual_stages_per_pipeline_rank"):
        kw["virtual_pipeline_model_parallel_size"] = int(a["num_virtual_stages_per_pipeline_rank"])
    kw["pipeline_dtype"] = torch.float16 if "fp16" in a else torch.bfloat16
    if "fp8_format" in a:
        kw["fp8"] = a["fp8_format"]
    return kw


def _megatron_plans():
    for case, (factory, model, cluster, ok) in CASES.items():
        if "megatron" in ok:
            yield f"case-{case}", factory(), model
    for name, exp in EXPECTED.items():
        if exp is not None:
            yield name, plan_for(name), model_entry(name).spec


PLANS = list(_megatron_plans())


@pytest.mark.parametrize("label,plan,model", PLANS, ids=[p[0] for p in PLANS])
def test_megatron_core_transformer_config_accepts_emitted_args(label, plan, model):
    torch, F, TransformerConfig = _mcore()
    kw = transformer_config_kwargs(build_args(plan, model), torch, F, TransformerConfig)
    cfg = TransformerConfig(**kw)  # raises on anything Megatron-Core's validation refuses
    assert cfg.num_layers == model.num_layers and cfg.kv_channels == model.dim_head
    assert cfg.num_query_groups == model.kv_heads and cfg.qk_layernorm == model.qk_norm
    assert cfg.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[model.norm]
    assert cfg.add_bias_linear == model.bias_linear and cfg.gated_linear_unit == (model.activation == "swiglu")
    if model.is_moe:
        assert cfg.num_moe_experts == model.num_experts and cfg.moe_router_topk == model.top_k


def test_megatron_core_validation_is_live():
    """The same path refuses what Megatron-Core refuses (tp not dividing the heads)."""
    torch, F, TransformerConfig = _mcore()
    factory, model, _, _ = CASES["uniform"]
    kw = transformer_config_kwargs(build_args(factory(), model), torch, F, TransformerConfig)
    kw["tensor_model_parallel_size"] = 3
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        TransformerConfig(**kw)


def test_megatron_core_position_embedding_choices():
    _mcore()
    import inspect
    import typing

    from megatron.core.models.gpt.gpt_model import GPTModel

    ann = inspect.signature(GPTModel.__init__).parameters["position_embedding_type"].annotation
    choices = set(typing.get_args(eval(ann, vars(sys.modules[GPTModel.__module__])) if isinstance(ann, str)
                                  else ann))
    for _, plan, model in PLANS:
        assert parse_argv(build_args(plan, model))["position_embedding_type"] in choices


def _single_stage_plan():
    from _emit_cases import LLAMA8B

    from haap_milp.specs import Plan, StagePlan

    st = (StagePlan(first_layer=0, num_layers=LLAMA8B.num_layers, gpu_type="a100-80g", tp=2, dp=8, recompute="full"),)
    return Plan(model=LLAMA8B.name, stages=st, micro_batch_size=2, num_microbatches=4, global_batch_size=64,
                seq_len=4096)


@pytest.mark.parametrize("which", ["pp2-selective", "pp1-full"])
def test_torchtitan_config_manager_accepts_emitted_module(which, tmp_path, monkeypatch):
    try:
        import torchtitan.models.llama3.config_registry  # noqa: F401
        from torchtitan.config import ConfigManager
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"torchtitan 0.3.0 with its trainer dependencies not importable ({type(exc).__name__}: {exc})")
    from _emit_cases import A100_16, H100_A100, LLAMA8B, llama_hetero_plan

    plan, cluster = (llama_hetero_plan(), H100_A100) if which == "pp2-selective" else (_single_stage_plan(), A100_16)
    files = emit(plan, "torchtitan", cluster, LLAMA8B)
    name = f"haap_tt_{which.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(files["haap_torchtitan.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    # the exact arguments of launch.sh, with the user's inputs filled in
    text = files["launch.sh"]
    tail = text[text.index("--config haap_plan") + len("--config haap_plan"):]
    argv = shlex.split(tail.replace("\\\n", " ").replace("${TORCHTITAN_EXTRA_ARGS:-}", ""))
    env = {"$HF_ASSETS_PATH": str(tmp_path), "$DATASET": "c4_test", "$DUMP_FOLDER": str(tmp_path / "out")}
    argv = [env.get(a, a) for a in argv]
    assert "--dump_folder" in argv and "--hf_assets_path" in argv
    cfg = ConfigManager().parse_args(["--module", name, "--config", "haap_plan", *argv])  # tyro + __post_init__
    assert cfg.dump_folder == str(tmp_path / "out") and cfg.hf_assets_path == str(tmp_path)
    par = cfg.parallelism
    assert par.pipeline_parallel_degree == plan.pp and par.tensor_parallel_degree == plan.stages[0].tp
    assert par.data_parallel_shard_degree * par.data_parallel_replicate_degree == plan.stages[0].dp
    assert cfg.training.global_batch_size == plan.global_batch_size
    assert cfg.model_spec.flavor == "8B"


def test_emit_refuses_what_megatron_core_would_refuse():
    """A plan whose tp does not divide the query groups never reaches the files."""
    factory, model, cluster, _ = CASES["uniform"]
    plan = factory()
    bad = plan.model_copy(update={"stages": tuple(s.model_copy(update={"tp": 8, "dp": 1}) for s in plan.stages)})
    with pytest.raises(EmitError):
        emit(bad, "megatron", cluster, model)
