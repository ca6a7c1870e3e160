"""The engines' own validation code on emitted files, where it is published as a package.

* Megatron-LM: ``megatron-core`` (PyPI) holds ``TransformerConfig`` / ``ModelParallelConfig`` whose
  ``__post_init__`` validates the model and parallel settings. Megatron-LM's
  ``megatron/training/arguments.py`` ``core_transformer_config_from_args`` builds it from the parsed
  arguments: every TransformerConfig field from the argument of the same name, plus
  ``layernorm_epsilon = norm_epsilon``, ``num_moe_experts = num_experts``, ``pipeline_dtype = params_dtype``,
  ``--swiglu`` -> ``gated_linear_unit`` + ``F.silu``, ``--disable-bias-linear`` -> ``add_bias_linear=False``
  (store_false). ``argparse``/``validate_args`` live in ``megatron/training`` (not in the package): their
  rules are re-checked in ``haap_milp/emit/megatron_rules.py`` (cited there) and tests/test_emit_megatron.py.
* torchtitan: ``torchtitan==0.3.0`` (PyPI, with triton) in CI; its config manager and model construction run
  on every emitted config in tests/test_emit_torchtitan_engine.py.
* FlagScale: not published as a package; rules re-checked in ``haap_milp/emit/flagscale.py`` (cited). Its model
  runs on its patched Megatron, so the arguments its runner makes of each emitted YAML go through the same
  Megatron-Core ``TransformerConfig`` below.

Install the validators: ``pip install -e '.[engines]'`` (megatron-core; torch 2.13.0 CPU as in .ci/run).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from _emit_cases import A100_16, CASES
from test_emit_catalog import EXPECTED, plan_for

from haap_milp.catalog.data import model_entry, model_names
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


def _config_class(args: dict, TransformerConfig):
    """The config class core_transformer_config_from_args builds: MLATransformerConfig under
    --multi-latent-attention (Megatron-LM arguments.py), else TransformerConfig."""
    if args.get("multi_latent_attention"):
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        return MLATransformerConfig
    return TransformerConfig


def make_config(kw: dict, TransformerConfig):
    """The config object for ``transformer_config_kwargs``' result (raises what Megatron-Core's validation raises)."""
    return _config_class(kw, TransformerConfig)(**kw)


def transformer_config_kwargs(argv: list[str], torch, F, TransformerConfig) -> dict:
    """``core_transformer_config_from_args`` on the emitted arguments (see the module docstring)."""
    import dataclasses

    a = parse_argv(argv)
    fields = {f.name for f in dataclasses.fields(_config_class(a, TransformerConfig))}
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
    for name in model_names():  # every catalog model Megatron-LM can build (OPT's ReLU MLP cannot)
        plan, model = plan_for(name), model_entry(name).spec
        try:
            emit(plan, "megatron", A100_16, model)
        except EmitError:
            assert model.activation == "relu", name
            continue
        yield name, plan, model


PLANS = list(_megatron_plans())
assert {name for name, exp in EXPECTED.items() if exp is not None} <= {label for label, _, _ in PLANS}


def flagscale_argv(files: dict) -> list[str]:
    """The Megatron arguments FlagScale's runner makes of the emitted YAML's ``system`` and ``model`` sections
    (flagscale/runner/runner_utils.py ``_flatten_dict_to_args``: key ``a_b`` -> ``--a-b``, True -> a bare flag,
    a list -> its items, nested dicts flattened), with mesh 0's sizes as FlagScale's pre_validate_args sets them
    on mesh 0's ranks (flagscale/train/arguments.py @01397a0 :233-255)."""
    import yaml

    cfg = yaml.safe_load(files["flagscale_train.yaml"])
    system = {k: v for k, v in cfg["system"].items() if k != "hetero"}
    tp, cp, ep, _dp, pp = cfg["system"]["hetero"]["hetero_process_meshes"][:5]
    system.update(tensor_model_parallel_size=tp, context_parallel_size=cp, pipeline_model_parallel_size=pp)
    if cfg["model"].get("num_experts"):
        system["expert_model_parallel_size"] = ep
    argv: list[str] = []

    def flat(d: dict):
        for k, v in d.items():
            if isinstance(v, dict):
                flat(v)
            elif isinstance(v, list):
                argv.extend([f"--{k.replace('_', '-')}", *map(str, v)])
            elif v is True:
                argv.append(f"--{k.replace('_', '-')}")
            elif v is not False and v is not None:
                argv.extend([f"--{k.replace('_', '-')}", str(v)])

    flat(system)
    flat(cfg["model"])
    return argv


def _flagscale_plans():
    for case, (factory, model, cluster, ok) in CASES.items():
        if "flagscale" in ok:
            yield f"case-{case}", factory(), model, cluster
    for label, plan, model in PLANS:
        if not label.startswith("case-"):
            yield label, plan, model, A100_16


FS_PLANS = list(_flagscale_plans())


@pytest.mark.parametrize("label,plan,model,cluster", FS_PLANS, ids=[p[0] for p in FS_PLANS])
def test_megatron_core_transformer_config_accepts_flagscale_yaml(label, plan, model, cluster):
    torch, F, TransformerConfig = _mcore()
    argv = flagscale_argv(emit(plan, "flagscale", cluster, model))
    drop = {"--use-distributed-optimizer", "--sequence-parallel", "--recompute-granularity-per-stage-micro-batch"}
    keep, skip = [], False
    for tok in argv:  # FlagScale-only and optimizer arguments are not TransformerConfig fields
        if tok.startswith("--"):
            skip = tok in drop
        if not skip:
            keep.append(tok)
    kw = transformer_config_kwargs(keep, torch, F, TransformerConfig)
    cfg = make_config(kw, TransformerConfig)
    assert cfg.num_layers == model.num_layers and cfg.num_query_groups == model.kv_heads
    if model.is_moe:
        assert cfg.num_moe_experts == model.num_experts and cfg.moe_token_dispatcher_type == "alltoall"


@pytest.mark.parametrize("label,plan,model", PLANS, ids=[p[0] for p in PLANS])
def test_megatron_core_transformer_config_accepts_emitted_args(label, plan, model):
    torch, F, TransformerConfig = _mcore()
    kw = transformer_config_kwargs(build_args(plan, model), torch, F, TransformerConfig)
    cfg = make_config(kw, TransformerConfig)  # raises on anything Megatron-Core's validation refuses
    assert cfg.num_layers == model.num_layers
    if model.is_mla:  # MLASelfAttention reads its own head dims, not kv_channels
        assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_head_dim, cfg.qk_pos_emb_head_dim, cfg.v_head_dim) == (
            model.q_lora_rank, model.kv_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim)
    else:
        assert cfg.kv_channels == model.dim_head
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
        make_config(kw, TransformerConfig)


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


def test_emit_refuses_what_megatron_core_would_refuse():
    """A plan whose tp does not divide the query groups never reaches the files."""
    factory, model, cluster, _ = CASES["uniform"]
    plan = factory()
    bad = plan.model_copy(update={"stages": tuple(s.model_copy(update={"tp": 8, "dp": 1}) for s in plan.stages)})
    with pytest.raises(EmitError):
        emit(bad, "megatron", cluster, model)
