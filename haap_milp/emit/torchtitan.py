"""torchtitan launch for uniform-tp/dp plans, with the non-uniform layer split.

Two forms, by engine version (``--engine-version``):

* ``0.3`` (default; torchtitan 0.3.0, the newest release on PyPI): a Python config module
  ``haap_torchtitan.py`` with ``haap_plan() -> Trainer.Config``, run as ``python -m torchtitan.train
  --module haap_torchtitan --config haap_plan`` (``torchtitan/config/manager.py`` ``_load_config``
  imports a fully-qualified module and calls the function). TOML job files are gone in this version.
* ``0.1`` (the TOML era): ``torchtitan.toml`` read by ``--job.config_file``.

The model (``torchtitan_models.choose``): a registry flavor equal to the plan's model on every field, else
(0.3) a definition built with torchtitan's own llama3 / qwen3 layer builders from the model's shapes, else a
refusal naming the architecture feature torchtitan lacks (GELU, LayerNorm, learned positions, biases, MoE
without q/k-norm).

Rules re-checked by hand (torchtitan 0.3.0, files inside the ``torchtitan`` package):

* ``config/configs.py:85`` ``mixed_precision_param`` is ``bfloat16`` or ``float32`` (no fp16);
* ``config/configs.py:279-287`` ``expert_parallel_degree``: ``dp_shard * cp * tp == efsdp * ep`` (ep divides
  dp_shard*cp*tp) and ``distributed/parallel_dims.py:401`` ``efsdp = dp_shard*cp*tp // ep``;
* ``distributed/parallel_dims.py:186`` ``dp_replicate * dp_shard * cp * tp * pp == world size``;
* ``trainer.py:127-138`` with pp > 1, ``local_batch_size % pipeline_parallel_microbatch_size == 0``;
* ``trainer.py:179-209`` CUDA graphs (on by default) refuse pipeline parallelism and the default EP token
  dispatchers: ``training.disable_cuda_graphs`` is set for such plans;
* ``trainer.py:420-425`` ``global_batch_size % (local_batch_size * dp) == 0`` (gradient accumulation);
* ZeRO (formulations/ eq. Z1; ``zero_stage``): 0 -> ``data_parallel_replicate_degree`` = dp; FSDP
  (``data_parallel_shard_degree`` = dp) is ZeRO-1 in a pipelined plan, because torch.distributed.pipelining runs
  every backward but the last with ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``
  (torch ``distributed/pipelining/stage.py`` ``backward_maybe_with_nosync``): parameters stay gathered and
  gradients unsharded through the step; and ZeRO-3 / ZeRO-2 in a single-stage plan, whose gradient-accumulation
  loop (``trainer.py:885``) syncs every micro-batch, with ``fsdp_reshard_after_forward`` ``always`` / ``never``
  (``config/configs.py:136``, ``distributed/fsdp.py:54``). ZeRO-2/3 with pp > 1 and ZeRO-1 without pp are refused;
* ``distributed/pipeline_parallel.py:443,465`` module names ``tok_embeddings``, ``layers.i``, ``norm``,
  ``lm_head`` (``output`` in the TOML era).
"""

from __future__ import annotations

import json

from haap_milp.emit.launch import Supply, launch_text
from haap_milp.emit.megatron import chunk_layers, launch_script, model_refusals
from haap_milp.emit.placement import place
from haap_milp.emit.torchtitan_models import ModelChoice, choose
from haap_milp.parallel_rules import tp_divides_heads
from haap_milp.specs import ModelSpec, Plan, Violation
from haap_milp.targets import TARGETS, EmitError

CAPABILITIES = TARGETS["torchtitan"]  # what presolve may plan for this engine (haap_milp.targets)

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
VERSIONS = {"0.3": "torchtitan 0.3.0 (Python config registries: --module/--config)",
            "0.1": "torchtitan 0.1 (TOML job config: --job.config_file)"}
DEFAULT_VERSION = "0.3"
ENGINE_VERSION = VERSIONS[DEFAULT_VERSION]


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


def refusals(plan: Plan, model: ModelSpec, version: str = DEFAULT_VERSION) -> list[Violation]:
    out = []
    for name, attr in (("tensor-parallel size", "tp"), ("data-parallel size", "dp"), ("recompute", "recompute"),
                       ("expert-parallel size", "ep"), ("ZeRO stage", "zero")):
        values = [getattr(s, attr) for s in plan.stages]
        if len(set(values)) > 1:
            out.append(Violation("torchtitan.uniform", None, f"per-stage {name} ({values}) is not supported by "
                                 f"torchtitan (one device mesh); use --target flagscale"))
    if any(s.etp != 1 for s in plan.stages):
        out.append(Violation("torchtitan.etp", None, "expert tensor parallelism (etp > 1) is not emitted for "
                             "torchtitan; use --target megatron"))
    if model.tied_embeddings and plan.pp > 1:
        out.append(Violation("torchtitan.tied", None, "tied input/output embeddings across pipeline stages are not "
                             "supported by torchtitan (models/common/decoder.py:139 refuses weight tying with pp > 1); "
                             "use --target megatron"))
    z = plan.stages[0].zero
    if z in (2, 3) and plan.pp > 1:
        out.append(Violation("torchtitan.zero", None, f"ZeRO {z} with pipeline parallelism: torch.distributed."
                             "pipelining keeps FSDP's parameters gathered and its gradients unsharded until the last "
                             "backward (stage.py backward_maybe_with_nosync), so torchtitan would run ZeRO-1 there, "
                             "not the sharded memory this plan counts on; re-plan with --target torchtitan --zero auto"))
    if z == 1 and plan.pp == 1:
        out.append(Violation("torchtitan.zero", None, "ZeRO 1 without pipeline parallelism: torchtitan has no "
                             "optimizer-only sharding and runs data_parallel_shard_degree as ZeRO-3 (a reduce-scatter "
                             "per micro-batch); re-plan with --target torchtitan --zero auto"))
    if plan.vpp > 1 and plan.schedule != "interleaved":
        out.append(Violation("torchtitan.schedule", None, f"vpp={plan.vpp} needs the interleaved schedule"))
    empty = [k for k, names in enumerate(module_fqns(plan)) if len(names) == 0]
    if empty:
        out.append(Violation("torchtitan.empty_part", None, f"model parts {empty} would hold no module (a stage has "
                             f"fewer layers than vpp={plan.vpp}); use --target megatron, whose layout allows "
                             f"empty virtual stages"))
    return out + _setup(model, plan.precision, plan.seq_len, version)


def setup_refusals(model: ModelSpec, training) -> list[Violation]:
    """What torchtitan refuses whatever the plan (``emit.setup_refusals``): the precision and the model."""
    return _setup(model, training.precision, training.seq_len, DEFAULT_VERSION)


def _setup(model: ModelSpec, precision: str, seq_len: int, version: str) -> list[Violation]:
    out = []
    if precision != "bf16":
        out.append(Violation("torchtitan.precision", None, f"precision {precision}: torchtitan's "
                             f"mixed_precision_param is bfloat16 or float32 (config/configs.py:85; fp8 needs a "
                             f"model converter haap does not write); re-plan with --precision bf16 or use "
                             f"--target megatron"))
    choice = choose(model, seq_len, version)
    if isinstance(choice, str):
        other = "" if model_refusals(model) else "; use --target megatron"  # (Megatron-LM builds it)
        out.append(Violation("torchtitan.model", None, f"torchtitan cannot build {model.name}: {choice}{other}"))
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
    shard = s.dp if zero_stage(plan) >= 1 else 1
    if model.is_moe and (shard * plan.cp * s.tp) % s.ep:
        out.append(Violation("torchtitan.ep", None, f"expert_parallel_degree={s.ep} must divide dp_shard*cp*tp = "
                             f"{shard}*{plan.cp}*{s.tp} (config/configs.py:279-287)"))
    if model.is_moe and model.num_experts % s.ep:
        out.append(Violation("torchtitan.experts_ep", None, f"ep={s.ep} must divide {model.num_experts} experts"))
    return out


def plan_violations(plan: Plan, model: ModelSpec, version: str = DEFAULT_VERSION) -> list[Violation]:
    return refusals(plan, model, version) or validate(plan, model)


def zero_stage(plan: Plan) -> int:
    """The plan's ZeRO stage (one for all stages under torchtitan): its own, else 1 with the distributed optimizer
    and 0 without (haap's megatron-preset default)."""
    z = plan.stages[0].zero
    return z if z is not None else 1 if plan.distributed_optimizer else 0


def fsdp_note(plan: Plan) -> str:
    """What data parallelism the emitted config runs, in words (module docstring, ZeRO)."""
    z = zero_stage(plan)
    if z == 0:
        return "data_parallel_replicate_degree = plain data parallel (ZeRO-0)"
    if plan.pp > 1:
        return ("data_parallel_shard_degree = FSDP under pipeline parallelism, which torch.distributed.pipelining "
                "runs as ZeRO-1 (gathered once, reduce-scattered after the last backward)")
    return (f"data_parallel_shard_degree = FSDP, fsdp_reshard_after_forward "
            f"{'never (ZeRO-2)' if z == 2 else 'always (ZeRO-3)'}" if plan.stages[0].zero is not None else
            "data_parallel_shard_degree = FSDP (ZeRO-3 per micro-batch, beyond the plan's ZeRO-1 memory model)")


def parallelism(plan: Plan, model: ModelSpec, version: str = DEFAULT_VERSION) -> dict:
    """``[parallelism]`` / ``ParallelismConfig`` fields."""
    s = plan.stages[0]
    z = zero_stage(plan)
    out = {
        "data_parallel_replicate_degree": 1 if z >= 1 else s.dp,
        "data_parallel_shard_degree": s.dp if z >= 1 else 1, "tensor_parallel_degree": s.tp,
        "context_parallel_degree": plan.cp, "pipeline_parallel_degree": plan.pp,
        "pipeline_parallel_schedule": "Interleaved1F1B" if plan.vpp > 1 else SCHEDULES[plan.schedule].replace(
            "Interleaved1F1B", "1F1B"),
        "pipeline_parallel_microbatch_size": plan.micro_batch_size,
        "module_fqns_per_model_part": module_fqns(plan, version),
    }
    if model.is_moe:
        out["expert_parallel_degree"] = s.ep
    if plan.pp == 1 and s.zero in (2, 3):  # eq. Z1: FSDP2's reshard_after_forward is the ZeRO-2 / ZeRO-3 choice
        out["fsdp_reshard_after_forward"] = "never" if s.zero == 2 else "always"
    return out


def _toml_value(v) -> str:
    return json.dumps(v)  # strings, ints, booleans and (nested) lists of them are valid TOML this way


def _choice(plan: Plan, model: ModelSpec, version: str) -> ModelChoice:
    choice = choose(model, plan.seq_len, version)
    assert not isinstance(choice, str), choice  # refusals() refused it before
    return choice


def build_toml(plan: Plan, model: ModelSpec) -> str:
    """The TOML job config of torchtitan 0.1 (``--engine-version 0.1``; registry flavors only)."""
    s, choice = plan.stages[0], _choice(plan, model, "0.1")
    sections = {
        "job": {"description": f"haap plan for {plan.model} on {plan.cluster or 'cluster'}"},
        "model": {"name": choice.family, "flavor": choice.flavor},
        "training": {"local_batch_size": local_batch(plan), "global_batch_size": plan.global_batch_size,
                     "seq_len": plan.seq_len, "mixed_precision_param": "bfloat16"},
        "parallelism": parallelism(plan, model, "0.1"),
        "activation_checkpoint": ({"mode": "selective", "selective_ac_option": "op"}
                                  if s.recompute in ("selective", "op") else {"mode": s.recompute}),
    }
    lines = [f"# torchtitan job config (haap) for {VERSIONS['0.1']}. Add [optimizer], data and checkpoint sections.",
             f"# [model] {choice.family} {choice.flavor} = {model.name} on every field ({choice.source} in 0.3.0).",
             *(["# data_parallel_shard_degree = FSDP (shards weights and gradients too, beyond the plan's ZeRO-1",
                "# memory model); each stage's ranks are placed by rank_map.json / launch.sh."] if s.zero is None else
               [f"# {fsdp_note(plan)};", "# each stage's ranks are placed by rank_map.json / launch.sh."])]
    for name, body in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def _py(v) -> str:
    return repr(v)


def _doc(text: str) -> str:
    """A name inside a generated docstring: a quote or backslash in it (model 'a\"\"\"b', 'x\\N') would end the
    docstring or make a bad escape, and haap_torchtitan.py would not compile."""
    return "".join("\\" + c if c in '\\"' else c if c.isprintable() else repr(c)[1:-1] for c in text)


def _model_lines(choice: ModelChoice, model: ModelSpec) -> tuple[list[str], list[str], list[str]]:
    """(docstring lines, extra imports, lines of haap_plan() that set the model)."""
    if not choice.built:
        return ([f"The model is torchtitan's registry flavor {choice.family} {choice.flavor}, equal to {_doc(model.name)} on",
                 f"every shape and architecture field ({choice.source})."], [],
                [f"    config.model_spec = model_registry({choice.flavor!r})"])
    doc = [f"The model is {_doc(model.name)}, built by haap_model() with torchtitan's own {choice.family} layer",
           f"builders ({choice.source}) from the model's shapes;",
           f"parallelize / pipelining / hooks are those of its registry flavor {choice.base_flavor!r}.",
           "RoPE without scaling (haap's model has none)."]
    if model.is_moe:
        doc.append("MoE load balancing: torchtitan's expert-bias update (load_balance_coeff 1e-3), not an aux loss.")
    plan_lines = [(f"    config.model_spec = dataclasses.replace(model_registry({choice.base_flavor!r}), "
                  f"flavor={choice.flavor!r}, model=haap_model())"),
                  "    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)"]
    return doc, [*choice.imports, ("torchtitan.models.common.config_utils", ("decoder_vocab_size",))], plan_lines


def _name_order(name: str) -> tuple[int, str]:
    """isort's order inside one import: CONSTANTS, Classes, functions."""
    bare = name.lstrip("_")
    return (0 if bare.isupper() else 1 if bare[:1].isupper() else 2, name)


def import_lines(imports: list[tuple[str, tuple[str, ...]]], built: bool) -> list[str]:
    """The module's import block, sorted as isort / ruff expect (one statement per module)."""
    mods: dict[str, set[str]] = {}
    for mod, names in imports:
        mods.setdefault(mod, set()).update(names)
    lines = ["import dataclasses", ""] if built else []
    for mod in sorted(mods):
        names = sorted(mods[mod], key=_name_order)
        noqa = "  # noqa: F401" if mod == "torchtitan.distributed.activation_checkpoint" else ""
        one = f"from {mod} import {', '.join(names)}{noqa}"
        lines += [one] if len(one) <= 120 else [f"from {mod} import ({noqa}", *[f"    {n}," for n in names], ")"]
    return lines


def build_python(plan: Plan, model: ModelSpec) -> str:
    """``haap_torchtitan.py``: the config-registry module of torchtitan 0.3 for this plan."""
    s, choice = plan.stages[0], _choice(plan, model, "0.3")
    # haap's "op" is torchtitan's SelectiveAC (op-level SAC; 0.3 has no other selective mode)
    ac = {"none": "None", "selective": "SelectiveAC.Config()", "op": "SelectiveAC.Config()",
          "full": "FullAC.Config()"}[s.recompute]
    par = parallelism(plan, model, "0.3")
    doc, imports, set_model = _model_lines(choice, model)
    lines = [f'"""torchtitan config (haap) for {VERSIONS["0.3"]}: {_doc(plan.model)} on {_doc(plan.cluster or "cluster")}.',
             "",
             "Run: python -m torchtitan.train --module haap_torchtitan --config haap_plan  (this folder on PYTHONPATH;",
             "launch.sh does it).", *doc,
             *(["data_parallel_shard_degree = FSDP (shards weights and gradients too, beyond the plan's ZeRO-1 memory",
                'model); each stage\'s ranks are placed by rank_map.json / launch.sh.'] if s.zero is None else
               [f"{fsdp_note(plan)};", "each stage's ranks are placed by rank_map.json / launch.sh."]),
             '"""',
             "",
             *import_lines([*imports, ("torchtitan.config", ("ParallelismConfig",)),
                            ("torchtitan.distributed.activation_checkpoint", ("FullAC", "SelectiveAC")),
                            (f"torchtitan.models.{choice.family}", ("model_registry",)),
                            (f"torchtitan.models.{choice.family}.config_registry", (choice.config_fn,))],
                           choice.built),
             ""]
    if choice.built:
        lines += ["", "def haap_model():", f'    """{_doc(model.name)}: the shapes haap planned."""', *choice.body, ""]
    lines += ["",
              "def haap_plan():",
              f"    config = {choice.config_fn}()  # trainer components (optimizer, data loader, loss) of torchtitan",
              *set_model,
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
    viol = plan_violations(plan, model, version)
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
