"""FlagScale heterogeneous training config (per-mesh tp/dp, per-stage layers and recompute).

FlagScale's validator is not a published package; its rules are re-checked here (``validate_flagscale_config``)
and in tests/test_emit_flagscale.py, each with the FlagScale source it follows (FlagOpen/FlagScale files as
stored at the commits named; line numbers of those versions):

* ``hetero_process_meshes``: flat list, 5 numbers per mesh ``tp, cp, ep, dp, pp`` (``flagscale/train/
  arguments.py`` @01397a0 ``pre_validate_args`` :128-135); ``pipeline_model_parallel_size == sum of the
  meshes' pp`` (:160-163); ``standalone_embedding_stage`` off (:164-166); meshes hold contiguous logical
  ranks in order, ``tp*cp*dp*pp`` each (:233-234; ep is not a factor);
* ``hetero_pipeline_layer_split``: one layer count per pipeline stage, summing to num_layers (:205-211);
* ``hetero_device_types``: one per mesh, ``hetero_current_device_type`` among them (:221-227); the runner sets
  each node's current type from its hostfile ``type=`` (``flagscale/runner/launcher`` SshLauncher._run_each)
  and parses ``type=(\\S+)`` (``flagscale/runner/runner_utils.py`` parse_hostfile :34), one line per host;
* ``data_parallel_size = dp_0``; mesh i runs micro-batch ``dp_0*mbs/dp_i``, so every stage sees the
  same samples: ``dp_0*mbs % dp_i == 0`` (:144-148, rescaled at :240-242);
* all meshes the same cp (:150-153); no virtual pipeline (``num_layers_per_virtual_pipeline_stage`` None,
  :191-195); the "ep all 1 or all not 1" assert (:155-158) is always true, so ep may differ per mesh;
* tied embeddings (or MTP): first and last mesh the same tp; with the distributed optimizer and
  different dp, one dp divides the other and ``use_partial_reduce_for_shared_embedding`` is on (:169-189);
* ``expert_tensor_parallel_size_per_process_mesh``: one entry per mesh (:137-141);
* per-stage recompute: ``recompute_granularity_per_stage_micro_batch`` entries
  ``"n_stages, n_mb, flag, ..."`` (flag 1 = full recompute, 0 = none; the micro-batch counts sum to
  the number of micro-batches; the stage counts sum to pp), which needs the global
  ``recompute_granularity: full`` (``post_validate_args`` ``_parse_recompute_refined_config``, from :266);
* rank order: ``RankMapper`` sorts physical ranks by the first index of their device type in
  ``hetero_device_types``, then by rank (``flagscale/train/hetero/parallel_context.py`` @34bd35b :75-88):
  hence distinct labels for a recurring type (``device_labels``); FlagScale's hetero guide asks for device
  type strings that are "not duplicated".
* cp > 1 is refused: the issue's run of FlagScale da4935e stopped at start-up ("Context parallelism is not
  supported"); that message was not found in the stored FlagScale sources, so the refusal rests on that run.
* ``moe_token_dispatcher_type`` is written out: Megatron's argument default is ``allgather``.

Meshes: consecutive stages with the same (GPU type, tp, dp, ep, etp) form one mesh with pp > 1
(FlagScale builds one Megatron process grid per mesh and indexes recompute by global pp rank,
so grouping changes nothing but the config's length).
"""

from __future__ import annotations

from haap_milp.emit.launch import Supply, launch_text
from haap_milp.emit.megatron import ENGINE_VERSION as MEGATRON_VERSION
from haap_milp.emit.megatron import _moe_args, model_args, model_refusals
from haap_milp.emit.megatron_rules import parse_argv
from haap_milp.emit.placement import dump_yaml, place
from haap_milp.parallel_rules import tp_divides_heads
from haap_milp.specs import ModelSpec, Plan, Violation
from haap_milp.targets import TARGETS, EmitError

CAPABILITIES = TARGETS["flagscale"]  # what presolve may plan for this engine (haap_milp.targets)


def meshes(plan: Plan) -> list[dict]:
    """Consecutive stages with equal (gpu type, tp, dp, ep, etp) -> one mesh each."""
    out: list[dict] = []
    for j, s in enumerate(plan.stages):
        key = (s.gpu_type, s.tp, s.dp, s.ep, s.etp)
        if out and out[-1]["key"] == key:
            out[-1]["pp"] += 1
            out[-1]["stages"].append(j)
        else:
            out.append({"key": key, "gpu_type": s.gpu_type, "tp": s.tp, "cp": plan.cp, "ep": s.ep, "dp": s.dp,
                        "pp": 1, "etp": s.etp, "stages": [j]})
    return out


def device_labels(ms: list[dict]) -> list[str]:
    """``hetero_device_types`` entry per mesh. FlagScale's rank mapper orders physical ranks by the first
    position of each type in ``hetero_device_types`` (all hostfile nodes of a type together), so a GPU
    type that recurs after another type (a100 | h100 | a100) would hand the h100 ranks to the second a100
    mesh. Each later run of a recurring type gets its own label (``a100-80g#2``), written as the
    ``type=`` of its nodes in the hostfile: every label then occurs in one contiguous run and the
    mapper's order is the mesh order. Adjacent meshes of one type share the label (one run)."""
    labels: list[str] = []
    runs: dict[str, int] = {}
    for i, mesh in enumerate(ms):
        t = mesh["gpu_type"]
        if i and ms[i - 1]["gpu_type"] == t:
            labels.append(labels[-1])
            continue
        runs[t] = runs.get(t, 0) + 1
        labels.append(t if runs[t] == 1 else f"{t}#{runs[t]}")
    return labels


def stage_labels(plan: Plan) -> list[str]:
    """The device label of each pipeline stage (its mesh's label)."""
    out: list[str] = []
    ms = meshes(plan)
    for mesh, label in zip(ms, device_labels(ms)):
        out += [label] * mesh["pp"]
    return out


def _recompute(plan: Plan) -> dict:
    modes = [s.recompute for s in plan.stages]
    if set(modes) == {"none"}:
        return {}
    if set(modes) == {"selective"}:
        return {"recompute_granularity": "selective"}
    full = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if set(modes) == {"full"}:
        return full
    m = plan.num_microbatches
    full["recompute_granularity_per_stage_micro_batch"] = [f"1, {m}, {1 if r == 'full' else 0}" for r in modes]
    return full


def build_config(plan: Plan, model: ModelSpec) -> dict:
    """The FlagScale train config (``system`` and ``model`` sections) as a dict."""
    ms = meshes(plan)
    flat = [x for mesh in ms for x in (mesh["tp"], mesh["cp"], mesh["ep"], mesh["dp"], mesh["pp"])]
    hetero = {
        "enable_hetero": True,
        "hetero_use_cpu_communication": False,
        "use_partial_reduce_for_shared_embedding": True,
        "hetero_pipeline_layer_split": [s.num_layers for s in plan.stages],
        "hetero_process_meshes": flat,
        "hetero_device_types": device_labels(ms),
        "hetero_current_device_type": device_labels(ms)[0],
        "standalone_embedding_stage": False,
    }
    if model.is_moe:
        hetero["expert_tensor_parallel_size_per_process_mesh"] = [mesh["etp"] for mesh in ms]
    system = {"tensor_model_parallel_size": ms[0]["tp"], "pipeline_model_parallel_size": plan.pp,
              "context_parallel_size": plan.cp, "sequence_parallel": plan.sequence_parallel,
              "use_distributed_optimizer": (plan.distributed_optimizer if plan.stages[0].zero is None
                                            else plan.stages[0].zero == 1),
              "precision": {"fp16": {"fp16": True}, "fp8": {"bf16": True, "fp8_format": "hybrid"},
                            "bf16": {"bf16": True}}.get(plan.precision, {}),  # fp32 / tf32: Megatron's default
              **_recompute(plan), "hetero": hetero}
    if model.is_moe:
        system["expert_model_parallel_size"] = ms[0]["ep"]
    mdl = _model_section(plan, model)
    mdl.update(micro_batch_size=plan.micro_batch_size, global_batch_size=plan.global_batch_size)
    return {"system": system, "model": mdl}


def _value(text: str):
    """An argument value as the YAML scalar FlagScale's config turns back into the same argument."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _model_section(plan: Plan, model: ModelSpec) -> dict:
    """The ``model`` section: Megatron's model-definition and MoE arguments (FlagScale passes each key as
    ``--key-with-dashes``), the parallel sizes left to ``system``."""
    argv = model_args(plan, model) + (_moe_args(plan, model) if model.is_moe else [])
    out = {}
    for k, v in parse_argv(argv).items():
        if k in ("expert_model_parallel_size", "expert_tensor_parallel_size"):
            continue
        out[k] = v if v is True else _value(str(v))
    return out


def setup_refusals(model: ModelSpec, training=None) -> list[Violation]:
    """What FlagScale refuses whatever the plan (``emit.setup_refusals``): Megatron-LM's model features."""
    return [Violation(v.rule.replace("megatron.", "flagscale."), None, v.message) for v in model_refusals(model)]


def refusals(plan: Plan, model: ModelSpec | None = None) -> list[Violation]:
    out = [] if model is None else setup_refusals(model)
    if plan.cp > 1:
        out.append(Violation("flagscale.cp", None, f"context parallelism (cp={plan.cp}): FlagScale's heterogeneous "
                             f"training refuses it at start-up ('Context parallelism is not supported'); "
                             f"use --target megatron"))
    zs = {s.zero for s in plan.stages if s.zero is not None}  # formulations/ eq. Z1
    if zs - {0, 1} or len({s.zero for s in plan.stages}) > 1:
        out.append(Violation("flagscale.zero", None, f"ZeRO stages {sorted(zs)} per stage: FlagScale sets one "
                             "use_distributed_optimizer (ZeRO-1) for all process meshes and has no ZeRO-2/3; re-plan "
                             "with --target flagscale"))
    if plan.vpp > 1 or plan.schedule == "interleaved":
        out.append(Violation("flagscale.no_vpp", None, f"FlagScale heterogeneous training has no virtual pipeline "
                             f"(vpp={plan.vpp}, schedule {plan.schedule}); use --target megatron"))
    if plan.schedule == "gpipe":
        out.append(Violation("flagscale.schedule", None, "FlagScale runs 1F1B, not GPipe"))
    modes = {s.recompute for s in plan.stages}
    if "op" in modes:
        out.append(Violation("flagscale.recompute", None, "recompute op (torchtitan's op-level selective activation "
                             "checkpointing) has no FlagScale setting; use --target torchtitan"))
    if "selective" in modes and len(modes) > 1:
        out.append(Violation("flagscale.recompute", None, f"per-stage recompute mixing selective with others "
                             f"({sorted(modes)}): FlagScale chooses only full-or-none per stage"))
    return out


def validate_flagscale_config(cfg: dict, num_layers: int, num_heads: int, kv_heads: int, tied: bool,
                              num_experts: int = 0) -> list[Violation]:
    """FlagScale's pre/post-validation of a hetero config (and Megatron's per-mesh tp/ep rules)."""
    sysc, mdl = cfg["system"], cfg["model"]
    h = sysc["hetero"]
    flat = h["hetero_process_meshes"]
    out: list[Violation] = []

    def bad(rule, msg):
        out.append(Violation(f"flagscale.{rule}", None, msg))

    if len(flat) % 5:
        return [Violation("flagscale.mesh_format", None, f"{len(flat)} numbers, not tp,cp,ep,dp,pp per mesh")]
    ms = [flat[i:i + 5] for i in range(0, len(flat), 5)]
    tps, cps, eps, dps, pps = (list(x) for x in zip(*ms))
    mbs, gbs = mdl["micro_batch_size"], mdl["global_batch_size"]
    split = h["hetero_pipeline_layer_split"]
    if sysc["pipeline_model_parallel_size"] != sum(pps):
        bad("pp_sum", f"pipeline_model_parallel_size {sysc['pipeline_model_parallel_size']} != sum of mesh pp {pps}")
    if len(split) != sysc["pipeline_model_parallel_size"] or sum(split) != num_layers:
        bad("layer_split", f"layer split {split} must have pp entries summing to num_layers={num_layers}")
    if len(h["hetero_device_types"]) != len(ms):
        bad("device_types", f"{len(h['hetero_device_types'])} device types for {len(ms)} meshes")
    for i, d in enumerate(dps):
        if (dps[0] * mbs) % d:
            bad("microbatch_rescale", f"dp_0*mbs = {dps[0]}*{mbs} not divisible by dp_{i}={d}")
    if len(set(cps)) > 1:
        bad("equal_cp", f"context-parallel sizes differ across meshes: {cps}")
    if gbs % (mbs * dps[0]):
        bad("global_batch", f"global batch {gbs} not divisible by mbs*dp_0 = {mbs}*{dps[0]}")
    if tied and tps[0] != tps[-1]:
        bad("tied_tp", f"tied embeddings need the first and last mesh at the same tp, got {tps[0]} and {tps[-1]}")
    if tied and dps[0] != dps[-1] and sysc["use_distributed_optimizer"]:
        if dps[0] % dps[-1] and dps[-1] % dps[0]:
            bad("tied_dp", f"tied embeddings: dp {dps[0]} and {dps[-1]} must divide one another")
        if not h.get("use_partial_reduce_for_shared_embedding"):
            bad("tied_dp", "tied embeddings with different dp need use_partial_reduce_for_shared_embedding")
    if "num_layers_per_virtual_pipeline_stage" in sysc:
        bad("no_vpp", "virtual pipeline is not supported with heterogeneous meshes")
    for i, (tp, ep) in enumerate(zip(tps, eps)):
        if not tp_divides_heads(num_heads, kv_heads, tp):
            bad("heads_tp", f"mesh {i}: tp={tp} must divide heads {num_heads} and kv heads {kv_heads}")
        if ep > 1 and (not num_experts or num_experts % ep):
            bad("experts_ep", f"mesh {i}: ep={ep} must divide num_experts={num_experts}")
        if ep > 1 and tp > 1 and not sysc.get("sequence_parallel"):
            bad("ep_tp_sp", f"mesh {i}: ep={ep} with tp={tp} needs sequence_parallel")
    out += _recompute_violations(sysc, len(split), gbs // max(1, mbs * dps[0]))
    return out


def _recompute_violations(sysc: dict, pp: int, num_mb: int) -> list[Violation]:
    entries = sysc.get("recompute_granularity_per_stage_micro_batch")
    if entries is None:
        return []
    out = []
    if sysc.get("recompute_granularity") != "full":
        out.append(Violation("flagscale.recompute", None, "per-stage recompute needs recompute_granularity full"))
    stages = 0
    for e in entries:
        nums = [int(x) for x in e.split(",")]
        stages += nums[0]
        if sum(nums[1::2]) != num_mb or any(f not in (0, 1) for f in nums[2::2]):
            out.append(Violation("flagscale.recompute", None, f"entry {e!r}: micro-batch counts must sum to "
                                 f"{num_mb} with flags 0/1"))
    if stages != pp:
        out.append(Violation("flagscale.recompute", None, f"recompute entries cover {stages} stages, pp={pp}"))
    return out


def plan_violations(plan: Plan, model: ModelSpec) -> list[Violation]:
    out = refusals(plan, model)
    if out:
        return out
    return validate_flagscale_config(build_config(plan, model), model.num_layers, model.num_heads, model.kv_heads,
                                     model.tied_embeddings, model.num_experts)


def emit(plan: Plan, cluster, model: ModelSpec, training=None) -> dict[str, str]:
    """flagscale_train.yaml, hostfile (with type=), rank_map.json, launch notes."""
    viol = plan_violations(plan, model)
    if viol:
        raise EmitError("FlagScale cannot run this plan: " + "; ".join(v.message for v in viol))
    placement = place(plan, cluster)
    labels = stage_labels(plan)
    types = {n.name: labels[placement.stage_of_rank(n.first_rank)] for n in placement.nodes}
    head = (f"# FlagScale heterogeneous training config (haap), for {ENGINE_VERSION}.\n"
            f"# The complete model definition of {model.name} and the plan's parallelism; merge into your train\n"
            "# YAML and add data, tokenizer, optimizer (LAUNCH.txt). Meshes: [tp, cp, ep, dp, pp] each; hostfile\n"
            "# order = mesh order.\n")
    return {"flagscale_train.yaml": head + dump_yaml(build_config(plan, model)),
            "hostfile": placement.hostfile(types=types), "rank_map.json": placement.rank_map_json(),
            "LAUNCH.txt": launch_text("flagscale", ENGINE_VERSION, placement, SUPPLIES, NOTES, cmd=COMMAND,
                                      where="Once, on the node you launch from (FlagScale's runner starts every "
                                            "node of the hostfile over ssh):")}


ENGINE_VERSION = f"FlagScale at da4935e (its patched {MEGATRON_VERSION})"
SUPPLIES = (
    Supply("FLAGSCALE", "the path of a FlagScale checkout at the version above"),
    Supply("data.data_path", "(train YAML) the Megatron indexed dataset prefix"),
    Supply("data.tokenizer", "(train YAML) tokenizer_type HFTokenizer and tokenizer_path, matching the model"),
    Supply("system.checkpoint", "(train YAML) save / load folders"),
)
NOTES = ["experiment.runner.hostfile: this folder's hostfile (placeholder names replaced, order and type= kept)",
         ("experiment.envs: CUDA_DEVICE_MAX_CONNECTIONS: 1 (Megatron requires it with tp/cp > 1; FlagScale's "
          "runner exports what experiment.envs lists)"),
         "the optimizer section (lr, schedule, train_iters) of train/<name>.yaml",
         ("device labels: a GPU type that recurs after another type gets its own label (a100-80g#2) in both "
          "hetero_device_types and the hostfile's type=, so FlagScale's rank mapper keeps the mesh order; "
          "repeat any device_type_specific settings of the plain type under that label")]
COMMAND = "cd <flagscale> && python run.py --config-path <folder of your experiment YAML> --config-name <name> action=run"
