"""torchtitan launch for uniform-tp/dp plans, with the non-uniform layer split.

Two forms, by engine version (``--engine-version``):

* ``0.3`` (default; torchtitan 0.3.0, the newest release on PyPI): a Python config module
  ``haap_torchtitan.py`` with ``haap_plan() -> Trainer.Config``, run as ``python -m torchtitan.train
  --module haap_torchtitan --config haap_plan`` (``torchtitan/config/manager.py`` ``_load_config``
  imports a fully-qualified module and calls the function). TOML job files are gone in this version.
* ``0.1`` (the TOML era): ``torchtitan.toml`` read by ``--job.config_file``.

The model is one of torchtitan's own registry flavors, chosen only when every shape and architecture
field of the plan's model equals it (``FLAVORS``, cited); any other model is refused with the field
that differs: torchtitan builds models in Python and has no GELU/LayerNorm/learned-position/bias
models, and haap does not write model-builder code.

Rules re-checked by hand (torchtitan 0.3.0, files inside the ``torchtitan`` package):

* ``config/configs.py:85`` ``mixed_precision_param`` is ``bfloat16`` or ``float32`` (no fp16);
* ``config/configs.py:279-287`` ``expert_parallel_degree``: ``dp_shard * cp * tp == efsdp * ep`` (ep divides
  dp_shard*cp*tp) and ``distributed/parallel_dims.py:401`` ``efsdp = dp_shard*cp*tp // ep``;
* ``distributed/parallel_dims.py:186`` ``dp_replicate * dp_shard * cp * tp * pp == world size``;
* ``trainer.py:127-138`` with pp > 1, ``local_batch_size % pipeline_parallel_microbatch_size == 0``;
* ``trainer.py:179-209`` CUDA graphs (on by default) refuse pipeline parallelism and the default EP token
  dispatchers: ``training.disable_cuda_graphs`` is set for such plans;
* ``trainer.py:420-425`` ``global_batch_size % (local_batch_size * dp) == 0`` (gradient accumulation);
* ``distributed/pipeline_parallel.py:443,465`` module names ``tok_embeddings``, ``layers.i``, ``norm``,
  ``lm_head`` (``output`` in the TOML era).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from haap_milp.emit.launch import Supply, launch_text
from haap_milp.emit.megatron import chunk_layers, launch_script
from haap_milp.emit.placement import place
from haap_milp.parallel_rules import tp_divides_heads
from haap_milp.specs import ModelSpec, Plan, Violation
from haap_milp.targets import TARGETS, EmitError

CAPABILITIES = TARGETS["torchtitan"]  # what presolve may plan for this engine (haap_milp.targets)

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
VERSIONS = {"0.3": "torchtitan 0.3.0 (Python config registries: --module/--config)",
            "0.1": "torchtitan 0.1 (TOML job config: --job.config_file)"}
DEFAULT_VERSION = "0.3"
ENGINE_VERSION = VERSIONS[DEFAULT_VERSION]


@dataclass(frozen=True)
class Flavor:
    """A torchtitan registry model and the ModelSpec fields it fixes."""

    module: str  # torchtitan.models.<module>
    flavor: str  # model_registry(<flavor>) / [model] flavor
    config_fn: str  # config_registry function that builds the trainer config around it (0.3)
    source: str  # where the shapes were read (torchtitan 0.3.0)
    shape: tuple[tuple[str, object], ...]


_LLAMA3 = (("activation", "swiglu"), ("norm", "rmsnorm"), ("positions", "rope"), ("rope_base", 500000.0),
           ("bias_linear", False), ("qkv_bias", False), ("qk_norm", False), ("tied_embeddings", False),
           ("num_experts", 0), ("vocab_size", 128256))
FLAVORS = (
    Flavor("llama3", "8B", "llama3_8b", "torchtitan/models/llama3/__init__.py:236-274",
           (("num_layers", 32), ("hidden", 4096), ("num_heads", 32), ("kv_heads", 8), ("dim_head", 128),
            ("ffn_hidden", 14336), *_LLAMA3)),
    Flavor("llama3", "70B", "llama3_70b", "torchtitan/models/llama3/__init__.py:277-315",
           (("num_layers", 80), ("hidden", 8192), ("num_heads", 64), ("kv_heads", 8), ("dim_head", 128),
            ("ffn_hidden", 28672), *_LLAMA3)),
    Flavor("llama3", "405B", "llama3_405b", "torchtitan/models/llama3/__init__.py:318-356",
           (("num_layers", 126), ("hidden", 16384), ("num_heads", 128), ("kv_heads", 8), ("dim_head", 128),
            ("ffn_hidden", 53248), *_LLAMA3)),
    # Qwen3-235B-A22B: torchtitan builds rope theta 5e6 (models/qwen3/__init__.py:557-595), the 2507 release;
    # the catalog model (HF Qwen/Qwen3-235B-A22B) has 1e6, so it does not match and is refused.
    Flavor("qwen3", "235B-A22B", "qwen3_30b_a3b", "torchtitan/models/qwen3/__init__.py:557-595",
           (("num_layers", 94), ("hidden", 4096), ("num_heads", 64), ("kv_heads", 4), ("dim_head", 128),
            ("num_experts", 128), ("top_k", 8), ("expert_ffn", 1536), ("vocab_size", 151936),
            ("activation", "swiglu"), ("norm", "rmsnorm"), ("positions", "rope"), ("rope_base", 5000000.0),
            ("bias_linear", False), ("qkv_bias", False), ("qk_norm", True), ("tied_embeddings", False),
            ("num_shared_experts", 0), ("capacity_factor", None))),
)


def match_flavor(model: ModelSpec) -> tuple[Flavor | None, str]:
    """The registry flavor equal to ``model`` on every field, else None and the closest flavor's first difference."""
    best, why = None, ""
    for fl in FLAVORS:
        diffs = [(k, v, getattr(model, k)) for k, v in fl.shape if getattr(model, k) != v]
        if not diffs:
            return fl, ""
        if best is None or len(diffs) < best:
            best = len(diffs)
            k, want, got = diffs[0]
            why = f"closest is {fl.module} {fl.flavor} ({fl.source}), which has {k}={want!r}, the model {got!r}"
    return None, why


def module_fqns(plan: Plan, version: str = DEFAULT_VERSION) -> list[list[str]]:
    """Model parts in virtual-stage order (part k = chunk k // pp of stage k % pp)."""
    head = "lm_head" if version == "0.3" else "output"
    chunks = chunk_layers(plan)
    sizes = [chunks[j][c] for c in range(plan.vpp) for j in range(plan.pp)]
    parts, layer = [], 0
    for k, n in enumerate(sizes):
        names = [f"layers.{i}" for i in range(layer, layer + n)]
        layer += n
        if k == 0:
            names.insert(0, "tok_embeddings")
        if k == len(sizes) - 1:
            names += ["norm", head]
        parts.append(names)
    return parts


def refusals(plan: Plan, model: ModelSpec) -> list[Violation]:
    out = []
    for name, attr in (("tensor-parallel size", "tp"), ("data-parallel size", "dp"), ("recompute", "recompute"),
                       ("expert-parallel size", "ep")):
        values = [getattr(s, attr) for s in plan.stages]
        if len(set(values)) > 1:
            out.append(Violation("torchtitan.uniform", None, f"per-stage {name} ({values}) is not supported by "
                                 f"torchtitan (one device mesh); use --target flagscale"))
    if any(s.etp != 1 for s in plan.stages):
        out.append(Violation("torchtitan.etp", None, "expert tensor parallelism (etp > 1) is not emitted for "
                             "torchtitan; use --target megatron"))
    if model.tied_embeddings and plan.pp > 1:
        out.append(Violation("torchtitan.tied", None, "tied input/output embeddings across pipeline stages are not "
                             "supported by torchtitan's pipeline split; use --target megatron"))
    if plan.vpp > 1 and plan.schedule != "interleaved":
        out.append(Violation("torchtitan.schedule", None, f"vpp={plan.vpp} needs the interleaved schedule"))
    if plan.precision != "bf16":
        out.append(Violation("torchtitan.precision", None, f"precision {plan.precision}: torchtitan's "
                             f"mixed_precision_param is bfloat16 or float32 (config/configs.py:85; fp8 needs a "
                             f"model converter haap does not write); re-plan with --precision bf16 or use "
                             f"--target megatron"))
    empty = [k for k, names in enumerate(module_fqns(plan)) if len(names) == 0]
    if empty:
        out.append(Violation("torchtitan.empty_part", None, f"model parts {empty} would hold no module (a stage has "
                             f"fewer layers than vpp={plan.vpp}); use --target megatron, whose layout allows "
                             f"empty virtual stages"))
    flavor, why = match_flavor(model)
    if flavor is None:
        out.append(Violation("torchtitan.model", None, f"torchtitan builds models from its registries and none is "
                             f"{model.name}: {why}; use --target megatron"))
    return out


def local_batch(plan: Plan) -> int:
    """``training.local_batch_size``: with pp > 1 one step's samples per dp rank (split into pipeline
    micro-batches); without pp one micro-batch, the rest by gradient accumulation (trainer.py:420-433)."""
    s = plan.stages[0]
    return plan.global_batch_size // s.dp if plan.pp > 1 else plan.micro_batch_size


def validate(plan: Plan, model: ModelSpec) -> list[Violation]:
    """The rules of the module docstring on the uniform degrees."""
    s, out = plan.stages[0], []
    local = local_batch(plan)
    if plan.global_batch_size % (local * s.dp):
        out.append(Violation("torchtitan.batch", None, f"global batch {plan.global_batch_size} not divisible by local "
                             f"batch * dp = {local}*{s.dp} (trainer.py:420-425)"))
    if plan.pp > 1 and local % plan.micro_batch_size:
        out.append(Violation("torchtitan.pp_microbatch", None, f"local batch {local} not divisible by the pipeline "
                             f"micro-batch {plan.micro_batch_size} (trainer.py:127-138)"))
    if not tp_divides_heads(model.num_heads, model.kv_heads, s.tp):
        out.append(Violation("torchtitan.heads_tp", None, f"tp={s.tp} must divide heads {model.num_heads} and kv heads "
                             f"{model.kv_heads}"))
    shard = s.dp if plan.distributed_optimizer else 1
    if model.is_moe and (shard * plan.cp * s.tp) % s.ep:
        out.append(Violation("torchtitan.ep", None, f"expert_parallel_degree={s.ep} must divide dp_shard*cp*tp = "
                             f"{shard}*{plan.cp}*{s.tp} (config/configs.py:279-287)"))
    if model.is_moe and model.num_experts % s.ep:
        out.append(Violation("torchtitan.experts_ep", None, f"ep={s.ep} must divide {model.num_experts} experts"))
    return out


def plan_violations(plan: Plan, model: ModelSpec) -> list[Violation]:
    return refusals(plan, model) or validate(plan, model)


def parallelism(plan: Plan, model: ModelSpec, version: str = DEFAULT_VERSION) -> dict:
    """``[parallelism]`` / ``ParallelismConfig`` fields."""
    s = plan.stages[0]
    out = {
        "data_parallel_replicate_degree": 1 if plan.distributed_optimizer else s.dp,
        "data_parallel_shard_degree": s.dp if plan.distributed_optimizer else 1, "tensor_parallel_degree": s.tp,
        "context_parallel_degree": plan.cp, "pipeline_parallel_degree": plan.pp,
        "pipeline_parallel_schedule": "Interleaved1F1B" if plan.vpp > 1 else SCHEDULES[plan.schedule].replace(
            "Interleaved1F1B", "1F1B"),
        "pipeline_parallel_microbatch_size": plan.micro_batch_size,
        "module_fqns_per_model_part": module_fqns(plan, version),
    }
    if model.is_moe:
        out["expert_parallel_degree"] = s.ep
    return out


def _toml_value(v) -> str:
    return json.dumps(v)  # strings, ints, booleans and (nested) lists of them are valid TOML this way


def build_toml(plan: Plan, model: ModelSpec) -> str:
    """The TOML job config of torchtitan 0.1 (``--engine-version 0.1``)."""
    s = plan.stages[0]
    flavor, _ = match_flavor(model)
    assert flavor is not None
    sections = {
        "job": {"description": f"haap plan for {plan.model} on {plan.cluster or 'cluster'}"},
        "model": {"name": flavor.module, "flavor": flavor.flavor},
        "training": {"local_batch_size": local_batch(plan), "global_batch_size": plan.global_batch_size,
                     "seq_len": plan.seq_len, "mixed_precision_param": "bfloat16"},
        "parallelism": parallelism(plan, model, "0.1"),
        "activation_checkpoint": {"mode": s.recompute, **({"selective_ac_option": "op"}
                                                          if s.recompute == "selective" else {})},
    }
    lines = [f"# torchtitan job config (haap) for {VERSIONS['0.1']}. Add [optimizer], data and checkpoint sections.",
             f"# [model] {flavor.module} {flavor.flavor} = {model.name} on every field ({flavor.source} in 0.3.0).",
             "# data_parallel_shard_degree = FSDP (shards weights and gradients too, beyond the plan's ZeRO-1",
             "# memory model); each stage's ranks are placed by rank_map.json / launch.sh."]
    for name, body in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def _py(v) -> str:
    return repr(v)


def build_python(plan: Plan, model: ModelSpec) -> str:
    """``haap_torchtitan.py``: the config-registry module of torchtitan 0.3 for this plan."""
    s = plan.stages[0]
    flavor, _ = match_flavor(model)
    assert flavor is not None
    ac = {"none": "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}[s.recompute]
    par = parallelism(plan, model, "0.3")
    lines = [f'"""torchtitan config (haap) for {VERSIONS["0.3"]}: {plan.model} on {plan.cluster or "cluster"}.',
             "",
             "Run: python -m torchtitan.train --module haap_torchtitan --config haap_plan  (this folder on PYTHONPATH;",
             (f"launch.sh does it). The model is torchtitan's registry flavor {flavor.module} {flavor.flavor}, "
              f"equal to {model.name}"),
             f"on every shape and architecture field ({flavor.source}).",
             "data_parallel_shard_degree = FSDP (shards weights and gradients too, beyond the plan's ZeRO-1 memory",
             'model); each stage\'s ranks are placed by rank_map.json / launch.sh.',
             '"""',
             "",
             "from torchtitan.config import ParallelismConfig",
             "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401",
             f"from torchtitan.models.{flavor.module} import model_registry",
             f"from torchtitan.models.{flavor.module}.config_registry import {flavor.config_fn}",
             "",
             "",
             "def haap_plan():",
             f"    config = {flavor.config_fn}()  # trainer components (optimizer, data loader, loss) of torchtitan",
             f"    config.model_spec = model_registry({flavor.flavor!r})",
             f"    config.training.local_batch_size = {local_batch(plan)}",
             f"    config.training.global_batch_size = {plan.global_batch_size}",
             f"    config.training.seq_len = {plan.seq_len}",
             '    config.training.mixed_precision_param = "bfloat16"']
    if plan.pp > 1 or (model.is_moe and s.ep > 1):  # trainer.py:179-209: CUDA graphs refuse pp and EP dispatchers
        lines.append("    config.training.disable_cuda_graphs = True")
    lines += ["    config.parallelism = ParallelismConfig("]
    lines += [f"        {k}={_py(v)}," for k, v in par.items()]
    lines += ["    )", f"    config.activation_checkpoint = {ac}", "    return config", ""]
    return "\n".join(lines)


SUPPLIES = (
    Supply("TORCHTITAN", "the path of a torchtitan checkout (or an install) at the version above"),
    Supply("HF_ASSETS_PATH", "the model's HuggingFace tokenizer folder (--hf_assets_path)"),
    Supply("DATASET", "a torchtitan dataset name or a HuggingFace dataset (--dataloader.dataset)"),
    Supply("DUMP_FOLDER", "a folder for checkpoints and logs (--dump_folder)"),
)
NOTES = [("TORCHTITAN_EXTRA_ARGS (optional): optimizer and schedule overrides, e.g. '--optimizer.lr 3e-4 "
          "--training.steps 1000'")]


def emit(plan: Plan, cluster, model: ModelSpec, training=None, version: str | None = None) -> dict[str, str]:
    version = version or DEFAULT_VERSION
    if version not in VERSIONS:
        raise EmitError(f"torchtitan engine version {version!r} is not emitted; use one of {', '.join(VERSIONS)}",
                        field="engine_version", value=version)
    viol = plan_violations(plan, model)
    if viol:
        raise EmitError("torchtitan cannot run this plan: " + "; ".join(v.message for v in viol))
    placement = place(plan, cluster)
    user = ('--hf_assets_path "$HF_ASSETS_PATH" --dataloader.dataset "$DATASET" --dump_folder "$DUMP_FOLDER" '
            "${TORCHTITAN_EXTRA_ARGS:-}")
    if version == "0.3":
        config_name, config_text = "haap_torchtitan.py", build_python(plan, model)
        entry = "-m torchtitan.train --module haap_torchtitan --config haap_plan \\\n    " + user
        pre = 'export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"'
    else:
        config_name, config_text = "torchtitan.toml", build_toml(plan, model)
        entry = '-m torchtitan.train --job.config_file "$HERE/torchtitan.toml" \\\n    ' + user.replace(
            "--hf_assets_path", "--model.hf_assets_path").replace("--dump_folder", "--job.dump_folder").replace(
            "--dataloader.dataset", "--training.dataset")
        pre = ""
    return {config_name: config_text,
            "launch.sh": launch_script(placement, entry, pre, supplies=SUPPLIES, cd="$TORCHTITAN"),
            "hostfile": placement.hostfile(), "rank_map.json": placement.rank_map_json(),
            "LAUNCH.txt": launch_text("torchtitan", VERSIONS[version], placement, SUPPLIES, NOTES)}
