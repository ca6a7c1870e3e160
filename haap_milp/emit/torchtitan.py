"""torchtitan job config (TOML) for uniform-tp/dp plans, with the non-uniform layer split.

Field names from torchtitan ``torchtitan/config/job_config.py`` (``[parallelism]``:
``data_parallel_replicate_degree``, ``data_parallel_shard_degree``, ``tensor_parallel_degree``,
``context_parallel_degree``, ``pipeline_parallel_degree``, ``pipeline_parallel_schedule`` (names of
``torch.distributed.pipelining``: ``GPipe``, ``1F1B``, ``Interleaved1F1B``),
``pipeline_parallel_microbatch_size``, ``module_fqns_per_model_part`` (one list of module names per
model part, e.g. ``[["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]``),
``expert_parallel_degree`` (cp <= ep <= dp_shard*cp); ``[activation_checkpoint] mode`` none |
selective | full; ``[training] local_batch_size`` (per dp rank), ``global_batch_size``, ``seq_len``).
Llama-style module names (``tok_embeddings``, ``layers.i``, ``norm``, ``output``). Interleaved
schedules place model part k on pipeline rank k % pp, as Megatron does.
"""

from __future__ import annotations

import json

from haap_milp.emit.megatron import chunk_layers, launch_script
from haap_milp.emit.placement import place
from haap_milp.parallel_rules import tp_divides_heads
from haap_milp.specs import ModelSpec, Plan
from haap_milp.targets import TARGETS, EmitError
from haap_milp.violations import Violation

CAPABILITIES = TARGETS["torchtitan"]  # what presolve may plan for this engine (haap_milp.targets)

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}


def module_fqns(plan: Plan) -> list[list[str]]:
    """Model parts in virtual-stage order (part k = chunk k // pp of stage k % pp)."""
    chunks = chunk_layers(plan)
    sizes = [chunks[j][c] for c in range(plan.vpp) for j in range(plan.pp)]
    parts, layer = [], 0
    for k, n in enumerate(sizes):
        names = [f"layers.{i}" for i in range(layer, layer + n)]
        layer += n
        if k == 0:
            names.insert(0, "tok_embeddings")
        if k == len(sizes) - 1:
            names += ["norm", "output"]
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
    empty = [k for k, names in enumerate(module_fqns(plan)) if not names]
    if empty:
        out.append(Violation("torchtitan.empty_part", None, f"model parts {empty} would hold no module (a stage has "
                             f"fewer layers than vpp={plan.vpp}); use --target megatron, whose layout allows "
                             f"empty virtual stages"))
    return out


def validate(plan: Plan, model: ModelSpec) -> list[Violation]:
    """torchtitan/Megatron-style divisibility on the uniform degrees."""
    s, out = plan.stages[0], []
    local = plan.global_batch_size // s.dp
    if plan.global_batch_size % s.dp or local % plan.micro_batch_size:
        out.append(Violation("torchtitan.batch", None, f"global batch {plan.global_batch_size} must split into dp={s.dp}"
                             f" local batches divisible by the micro-batch {plan.micro_batch_size}"))
    if not tp_divides_heads(model.num_heads, model.kv_heads, s.tp):
        out.append(Violation("torchtitan.heads_tp", None, f"tp={s.tp} must divide heads {model.num_heads} and kv heads "
                             f"{model.kv_heads}"))
    if model.is_moe and s.ep > 1 and not plan.cp <= s.ep <= s.dp * plan.cp:
        out.append(Violation("torchtitan.ep", None, f"expert_parallel_degree={s.ep} must lie in [cp, dp*cp] = "
                             f"[{plan.cp}, {s.dp * plan.cp}]"))
    if model.is_moe and model.num_experts % s.ep:
        out.append(Violation("torchtitan.experts_ep", None, f"ep={s.ep} must divide {model.num_experts} experts"))
    return out


def plan_violations(plan: Plan, model: ModelSpec) -> list[Violation]:
    return refusals(plan, model) or validate(plan, model)


def _toml_value(v) -> str:
    return json.dumps(v)  # strings, ints, booleans and (nested) lists of them are valid TOML this way


def build_toml(plan: Plan, model: ModelSpec) -> str:
    s = plan.stages[0]
    shard = s.dp if plan.distributed_optimizer else 1
    parallelism = {
        "data_parallel_replicate_degree": 1 if plan.distributed_optimizer else s.dp,
        "data_parallel_shard_degree": shard, "tensor_parallel_degree": s.tp,
        "context_parallel_degree": plan.cp, "pipeline_parallel_degree": plan.pp,
        "pipeline_parallel_schedule": "Interleaved1F1B" if plan.vpp > 1 else SCHEDULES[plan.schedule].replace(
            "Interleaved1F1B", "1F1B"),
        "pipeline_parallel_microbatch_size": plan.micro_batch_size,
        "module_fqns_per_model_part": module_fqns(plan),
    }
    if model.is_moe:
        parallelism["expert_parallel_degree"] = s.ep
    sections = {
        "job": {"description": f"haap plan for {plan.model} on {plan.cluster or 'cluster'}"},
        "training": {"local_batch_size": plan.global_batch_size // s.dp, "global_batch_size": plan.global_batch_size,
                     "seq_len": plan.seq_len, "mixed_precision_param": "float16" if plan.precision == "fp16"
                     else "bfloat16"},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": s.recompute, **({"selective_ac_option": "op"}
                                                          if s.recompute == "selective" else {})},
    }
    lines = ["# torchtitan job config (haap). Add [model] name/flavor, [optimizer], data and checkpoint sections.",
             "# data_parallel_shard_degree = FSDP (shards weights and gradients too, beyond the plan's ZeRO-1",
             "# memory model); each stage's ranks are placed by rank_map.json / launch.sh."]
    for name, body in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def emit(plan: Plan, cluster, model: ModelSpec, training=None) -> dict[str, str]:
    viol = plan_violations(plan, model)
    if viol:
        raise EmitError("torchtitan cannot run this plan: " + "; ".join(v.message for v in viol))
    placement = place(plan, cluster)
    return {"torchtitan.toml": build_toml(plan, model),
            "launch.sh": launch_script(placement, '-m torchtitan.train --job.config_file "$(dirname "$0")/torchtitan.toml"'),
            "hostfile": placement.hostfile(), "rank_map.json": placement.rank_map_json()}
