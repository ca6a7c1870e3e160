"""Megatron-LM's argument-validation rules that matter for a plan, re-implemented in pure Python.

Sources (NVIDIA/Megatron-LM, read with the search tool):
* ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` — the layout grammar
  (``parse_str_to_list``: commas are cosmetic, ``(...)*n`` and ``x*n`` unroll, ``|`` separates
  stages, characters ``E`` embedding, ``L`` loss, ``t`` decoder, ``m`` MTP) and
  ``validate_layer_layout`` (E first and once, L last and once, decoder count = num_layers, length
  divisible by pp, vpp = length / pp);
* ``megatron/training/arguments.py`` ``validate_args`` — world size divisible by tp*pp*cp; layout
  excludes the other vpp flags; without a layout num_layers % pp == 0; vpp needs pp > 2 without
  ``--overlap-p2p-comm``; seq_length % (2*cp) == 0 for cp > 1; experts % ep == 0; selective
  recompute takes no method; global batch given;
* ``megatron/core/num_microbatches_calculator.py`` — global_batch % (micro_batch * dp) == 0;
* ``megatron/core/transformer/transformer_config.py`` — heads % tp == 0, query groups % tp == 0;
* ``megatron/core/model_parallel_config.py`` — ep > 1 and tp > 1 need sequence parallelism;
* ``megatron/core/parallel_state.py`` — world % (etp * ep * pp) == 0 (expert groups);
* ``megatron/core/pipeline_parallel/schedules.py`` — interleaving: M % pp == 0 (group size pp).
"""

from __future__ import annotations

import re

from haap_milp.specs import Violation

LAYER_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


def parse_layout(layout: str) -> list[list[str]]:
    """``PipelineParallelLayerLayout.parse_str_to_list``: layout string -> one list of chars per stage."""
    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    out = []
    for stage in s.split("|"):
        bad = [c for c in stage if c not in LAYER_CHARS]
        if bad:
            raise ValueError(f"invalid layer character {bad[0]!r} in layout {layout!r}; known: {list(LAYER_CHARS)}")
        out.append(list(stage))
    return out


def layout_violations(layout: str, pp: int, num_layers: int) -> list[Violation]:
    """``validate_layer_layout`` plus the pp divisibility of ``PipelineParallelLayerLayout.__init__``."""
    try:
        stages = parse_layout(layout)
    except ValueError as exc:
        return [Violation("megatron.layout_grammar", None, str(exc))]
    out = []
    if len(stages) % pp:
        out.append(Violation("megatron.layout_pp", None, f"layout has {len(stages)} stages, not divisible by pp={pp}"))
    flat = [c for st in stages for c in st]
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        out.append(Violation("megatron.layout_embedding", None, "the first layer must be the one embedding 'E'"))
    if not flat or flat[-1] != "L" or flat.count("L") != 1:
        out.append(Violation("megatron.layout_loss", None, "the last layer must be the one loss 'L'"))
    if flat.count("t") != num_layers:
        out.append(Violation("megatron.layout_layers", None,
                             f"layout holds {flat.count('t')} decoder layers, model has num_layers={num_layers}"))
    return out


def parse_argv(argv: list[str]) -> dict[str, object]:
    """``--flag value`` / ``--switch`` pairs -> {"flag": value or True} (underscored, like argparse)."""
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        key = argv[i].lstrip("-").replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[key] = argv[i + 1]
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def _int(args: dict, key: str, default: int) -> int:
    return int(args.get(key, default))  # type: ignore[arg-type]


def validate_megatron_args(argv: list[str], world_size: int) -> list[Violation]:
    """Every rule above that the argument list breaks, with its numbers (empty: Megatron accepts it)."""
    a = parse_argv(argv)
    tp, pp = _int(a, "tensor_model_parallel_size", 1), _int(a, "pipeline_model_parallel_size", 1)
    cp = _int(a, "context_parallel_size", 1)
    out: list[Violation] = []

    def bad(rule: str, msg: str) -> None:
        out.append(Violation(f"megatron.{rule}", None, msg))

    if world_size % (tp * pp * cp):
        bad("world_size", f"world size {world_size} not divisible by tp*pp*cp = {tp}*{pp}*{cp}")
        return out
    dp = world_size // (tp * pp * cp)
    mbs, gbs = _int(a, "micro_batch_size", 1), _int(a, "global_batch_size", 0)
    if gbs <= 0 or gbs % (mbs * dp):
        bad("global_batch", f"global batch {gbs} not divisible by micro batch * dp = {mbs}*{dp}")
    heads, layers = _int(a, "num_attention_heads", 1), _int(a, "num_layers", 1)
    if heads % tp:
        bad("heads_tp", f"num_attention_heads={heads} not divisible by tp={tp}")
    if "group_query_attention" in a and _int(a, "num_query_groups", heads) % tp:
        bad("query_groups_tp", f"num_query_groups={a['num_query_groups']} not divisible by tp={tp}")
    vpp_flags = [k for k in ("pipeline_model_parallel_layout", "num_virtual_stages_per_pipeline_rank",
                             "num_layers_per_virtual_pipeline_stage") if k in a]
    if len(vpp_flags) > 1:
        bad("vpp_flags", f"at most one of {vpp_flags} may be set")
    vpp = 1
    if "pipeline_model_parallel_layout" in a:
        layout = str(a["pipeline_model_parallel_layout"])
        out += layout_violations(layout, pp, layers)
        try:
            vpp = max(1, len(parse_layout(layout)) // pp)
        except ValueError:
            pass
    elif "num_virtual_stages_per_pipeline_rank" in a:
        vpp = _int(a, "num_virtual_stages_per_pipeline_rank", 1)
        if layers % (pp * vpp):
            bad("layers_vpp", f"num_layers={layers} not divisible by pp*vpp = {pp}*{vpp}")
    elif layers % pp:
        bad("layers_pp", f"num_layers={layers} not divisible by pp={pp}; give --pipeline-model-parallel-layout")
    if vpp > 1:
        if pp <= 2 and "overlap_p2p_comm" not in a:
            bad("vpp_pp", f"interleaving (vpp={vpp}) needs pp > 2 without --overlap-p2p-comm, got pp={pp}")
        if gbs > 0 and dp and (gbs // (mbs * dp)) % pp:
            bad("vpp_microbatches", f"interleaving needs micro-batches {gbs // (mbs * dp)} divisible by pp={pp}")
    seq = _int(a, "seq_length", 0)
    if cp > 1 and seq % (2 * cp):
        bad("seq_cp", f"seq_length={seq} not divisible by 2*cp = {2 * cp}")
    out += _moe_violations(a, world_size, tp, pp)
    if a.get("recompute_granularity") == "selective" and "recompute_method" in a:
        bad("recompute_method", "selective recompute takes no --recompute-method")
    return out


def _moe_violations(a: dict, world_size: int, tp: int, pp: int) -> list[Violation]:
    out = []
    ep, etp = _int(a, "expert_model_parallel_size", 1), _int(a, "expert_tensor_parallel_size", tp)
    experts = _int(a, "num_experts", 0)
    if ep > 1 and not experts:
        out.append(Violation("megatron.ep_dense", None, f"expert_model_parallel_size={ep} without --num-experts"))
    if experts and experts % ep:
        out.append(Violation("megatron.experts_ep", None, f"num_experts={experts} not divisible by ep={ep}"))
    if ep > 1 and tp > 1 and "sequence_parallel" not in a:
        out.append(Violation("megatron.ep_tp_sp", None, f"ep={ep} with tp={tp} needs --sequence-parallel"))
    if world_size % (etp * ep * pp):
        out.append(Violation("megatron.expert_groups", None,
                             f"world size {world_size} not divisible by etp*ep*pp = {etp}*{ep}*{pp}"))
    return out
