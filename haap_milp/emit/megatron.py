"""Megatron-LM launch: the argument list, the non-uniform layer split, and the rank order.

Megatron-LM runs one (tp, dp, recompute, ep) everywhere but any layer split
(``--pipeline-model-parallel-layout``, ``megatron/core/transformer/pipeline_parallel_layer_layout.py``)
and, through the rank order, any GPU type per stage: stage j owns the j-th contiguous block of
world ranks (``tp-cp-ep-dp-pp`` order, pp slowest), so placing those ranks on the stage's GPUs
(``placement.py``) puts each stage on its GPU type. Plans with per-stage tp/dp/recompute/ep are
refused with a pointer to ``--target flagscale``.
"""

from __future__ import annotations

import shlex

from haap_milp.emit.launch import Supply, launch_text, require_lines
from haap_milp.emit.megatron_rules import validate_megatron_args
from haap_milp.emit.placement import place
from haap_milp.specs import ModelSpec, Plan, Violation
from haap_milp.targets import TARGETS, EmitError

CAPABILITIES = TARGETS["megatron"]  # what presolve may plan for this engine (haap_milp.targets)


def chunk_layers(plan: Plan) -> list[list[int]]:
    """Decoder layers per (stage, virtual chunk): stage j's layers split over vpp chunks, earlier chunks
    taking the remainder (the plan fixes only how many layers each GPU group holds)."""
    out = []
    for st in plan.stages:
        base, extra = divmod(st.num_layers, plan.vpp)
        out.append([base + (1 if v < extra else 0) for v in range(plan.vpp)])
    return out


def _stage_text(n: int) -> str:
    return "" if n == 0 else ("t" if n == 1 else f"t*{n}")


def layout_string(plan: Plan) -> str | None:
    """``--pipeline-model-parallel-layout`` for the plan, or None when Megatron's default split is it."""
    chunks = chunk_layers(plan)
    p, v = plan.pp, plan.vpp
    sizes = [chunks[j][c] for c in range(v) for j in range(p)]  # virtual stage k = c*P + j
    if len(set(sizes)) == 1:
        return None  # even split: --num-layers (and --num-virtual-stages-per-pipeline-rank) say it
    parts = []
    for k, n in enumerate(sizes):
        body = _stage_text(n)
        if k == 0:
            body = "E" + ("," + body if body else "")
        if k == len(sizes) - 1:
            body = (body + "," if body else "") + "L"
        parts.append(body)
    return "|".join(parts)


def refusals(plan: Plan, model: ModelSpec) -> list[Violation]:
    """Features of the plan Megatron-LM cannot express."""
    out = []
    first = plan.stages[0]
    for name, attr in (("tensor-parallel size", "tp"), ("data-parallel size", "dp"), ("recompute", "recompute"),
                       ("expert-parallel size", "ep"), ("expert tensor-parallel size", "etp"), ("ZeRO stage", "zero")):
        values = [getattr(s, attr) for s in plan.stages]
        if len(set(values)) > 1:
            out.append(Violation("megatron.uniform", None,
                                 f"per-stage {name} ({values}) is not supported by Megatron-LM, which runs one value "
                                 f"on every stage; use --target flagscale (heterogeneous process meshes)"))
    if first.recompute == "op":
        out.append(Violation("megatron.recompute", None, "recompute op (torchtitan's op-level selective activation "
                             "checkpointing) has no Megatron-LM flag (--recompute-granularity is full or selective, "
                             "by module); use --target torchtitan or re-plan with --recompute none,selective,full"))
    if first.zero in (2, 3):  # eq. Z1 (targets.py: the megatron target runs ZeRO 0 and 1)
        out.append(Violation("megatron.zero", None, f"ZeRO {first.zero}: haap emits Megatron-Core's DDP and its "
                             "distributed optimizer (ZeRO-1, --use-distributed-optimizer) only; ZeRO-2/3 need "
                             "Megatron-FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy), which haap neither "
                             "prices nor emits; re-plan with --zero 0,1 or use --target torchtitan"))
    if plan.schedule == "gpipe":
        out.append(Violation("megatron.schedule", None, "Megatron-LM runs 1F1B or interleaved 1F1B, not GPipe; "
                             "re-plan with schedule 1f1b"))
    if plan.vpp > 1 and plan.schedule != "interleaved":
        out.append(Violation("megatron.schedule", None, f"vpp={plan.vpp} needs the interleaved schedule"))
    if not model.is_moe and first.ep > 1:
        out.append(Violation("megatron.ep_dense", None, f"ep={first.ep} on a dense model"))
    return out


ENGINE_VERSION = "Megatron-LM at d98e8a6 (megatron-core 0.16)"  # what the argument names and rules follow


def model_args(plan: Plan, model: ModelSpec) -> list[str]:
    """The complete model definition as Megatron-LM arguments (``megatron/training/arguments.py``
    ``_add_network_size_args``; they become ``TransformerConfig`` fields of the same name)."""
    a = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden),
         "--ffn-hidden-size", str(model.ffn_hidden), "--num-attention-heads", str(model.num_heads)]
    if model.is_mla:  # Megatron-Core MLASelfAttention (arguments.py: --multi-latent-attention and its dims)
        a += ["--multi-latent-attention", "--kv-lora-rank", str(model.kv_lora_rank),
              "--qk-head-dim", str(model.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim),
              "--v-head-dim", str(model.v_head_dim)]
        if model.q_lora_rank:
            a += ["--q-lora-rank", str(model.q_lora_rank)]
    else:
        a += ["--kv-channels", str(model.dim_head)]
    if model.kv_heads != model.num_heads:
        a += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    a += ["--seq-length", str(plan.seq_len), "--max-position-embeddings", str(max(plan.seq_len, model.seq_len))]
    a += ["--normalization", {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[model.norm],
          "--norm-epsilon", _num(model.norm_epsilon)]
    if model.positions == "rope":
        a += ["--position-embedding-type", "rope", "--rotary-base", _num(model.rope_base)]
    else:
        a += ["--position-embedding-type", {"learned": "learned_absolute", "none": "none"}[model.positions]]
    if model.activation == "swiglu":
        a.append("--swiglu")  # gated SiLU; without it Megatron's MLP is GELU
    if not model.bias_linear:
        a.append("--disable-bias-linear")
        if model.qkv_bias:
            a.append("--add-qkv-bias")
    if model.qk_norm:
        a.append("--qk-layernorm")
    if not model.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    return a


def _num(x: float) -> str:
    """A float as Megatron's argparse reads it (1e-06, 500000)."""
    return str(int(x)) if float(x).is_integer() and abs(x) >= 1 else repr(float(x))


def model_refusals(model: ModelSpec) -> list[Violation]:
    """Model features Megatron-LM's command line cannot build (arguments.py: the MLP is GELU unless
    --swiglu / --squared-relu; there is no plain ReLU)."""
    if model.activation == "relu":
        return [Violation("megatron.activation", None, "plain ReLU MLP (OPT) has no Megatron-LM argument (GELU, "
                          "--swiglu or --squared-relu only); the launch files would train a different model")]
    return []


def setup_refusals(model: ModelSpec, training=None) -> list[Violation]:
    """What Megatron-LM refuses whatever the plan (``emit.setup_refusals``): the model's own features."""
    return model_refusals(model)


def approximations(model: ModelSpec) -> list[str]:
    """Model features the arguments approximate (written into the args file)."""
    out = []
    if model.bias_linear and not model.qkv_bias:
        out.append("the model has no Q/K/V bias but Megatron's --add-bias-linear (default) also biases Q/K/V")
    return out


def build_args(plan: Plan, model: ModelSpec) -> list[str]:
    """The Megatron-LM command-line arguments of the plan (model definition, parallelism, batch, precision)."""
    s = plan.stages[0]
    a = model_args(plan, model)
    a += ["--tensor-model-parallel-size", str(s.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    if plan.cp > 1:
        a += ["--context-parallel-size", str(plan.cp)]
    layout = layout_string(plan)
    if layout is not None:
        a += ["--pipeline-model-parallel-layout", layout]
    elif plan.vpp > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)]
    a += ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch_size)]
    if plan.sequence_parallel and s.tp > 1:
        a.append("--sequence-parallel")
    if (plan.distributed_optimizer if s.zero is None else s.zero == 1):  # ZeRO-1 (eq. Z1); 0: plain DDP
        a.append("--use-distributed-optimizer")
    # fp32 / tf32: no precision flag, Megatron's default is fp32 weights and compute (whether its fp32 GEMMs use
    # TF32 tensor cores follows PyTorch's allow_tf32 setting of the launch environment; haap prices fp32 on TF32
    # where the GPU has it, estimator/compute.py)
    a += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16", "--fp8-format", "hybrid"], "fp32": [],
          "tf32": []}[plan.precision]
    if s.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
    elif s.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if model.is_moe:
        a += _moe_args(plan, model)
    return a


def moe_layer_freq(model: ModelSpec) -> str | None:
    """``--moe-layer-freq`` as an explicit 0/1 pattern (Megatron's integer N means i % N == 0, which is
    not our every_k convention i % k == k-1), or None when every layer is MoE."""
    flags = [1 if model.is_moe_layer(i) else 0 for i in range(model.num_layers)]
    if all(flags):
        return None
    return "[" + ",".join(map(str, flags)) + "]"


def _moe_args(plan: Plan, model: ModelSpec) -> list[str]:
    """MoE layers, router and dispatcher (``_add_moe_args``): softmax top-k router (softmax over the k chosen
    logits, Mixtral / Qwen3 with norm_topk_prob), aux-loss load balancing, all-to-all dispatch."""
    s = plan.stages[0]
    a = ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.top_k),
         "--moe-ffn-hidden-size", str(model.expert_ffn), "--expert-model-parallel-size", str(s.ep),
         "--expert-tensor-parallel-size", str(s.etp), "--moe-token-dispatcher-type", "alltoall",
         "--moe-router-score-function", "softmax"]
    if model.moe_aux_loss_coeff > 0:
        a += ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", _num(model.moe_aux_loss_coeff)]
    else:
        a += ["--moe-router-load-balancing-type", "none"]
    if model.num_experts >= 32:
        a += ["--moe-router-dtype", "fp32"]  # Megatron-Core warns without fp32 routing at >= 32 experts
    if model.num_shared_experts:
        a += ["--moe-shared-expert-intermediate-size", str(model.num_shared_experts * model.shared_ffn)]
    freq = moe_layer_freq(model)
    if freq is not None:
        a += ["--moe-layer-freq", freq]
    if model.capacity_factor is not None:
        a += ["--moe-expert-capacity-factor", _num(model.capacity_factor), "--moe-token-drop-policy", "probs"]
    return a


def plan_violations(plan: Plan, model: ModelSpec) -> list[Violation]:
    """Refusals plus Megatron's argument validation of the arguments the plan would get."""
    out = refusals(plan, model) + model_refusals(model)
    if out:
        return out
    return validate_megatron_args(build_args(plan, model), plan.num_gpus)


SUPPLIES = (
    Supply("MEGATRON_LM", "the path of a Megatron-LM checkout at the version above (pretrain_gpt.py runs from it)"),
    Supply("DATA_PATH", "the Megatron indexed dataset prefix (tools/preprocess_data.py output, without .bin/.idx)"),
    Supply("TOKENIZER_MODEL", "a HuggingFace tokenizer name or folder whose vocabulary matches the model's"),
    Supply("CHECKPOINT_DIR", "a folder for checkpoints (--save and --load)"),
)
NOTES = ["MEGATRON_EXTRA_ARGS (optional): optimizer and schedule, e.g. '--lr 3e-4 --min-lr 3e-5 --train-iters 10000'"]


def _args_file(plan: Plan, model: ModelSpec, argv: list[str]) -> str:
    lines = [f"# Megatron-LM arguments for this plan (haap), for {ENGINE_VERSION}: the complete model definition",
             f"# of {model.name} and the plan's parallelism; data, tokenizer and optimizer come from launch.sh.",
             *[f"# approximation: {x}" for x in approximations(model)],
             f"# {plan.pp} stages: " + "; ".join(f"{j}: {s.num_layers} layers on {s.gpu_type}@{s.island}"
                                                 for j, s in enumerate(plan.stages)),
             "MEGATRON_ARGS=("]
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            lines.append(f"  {argv[i]} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            lines.append(f"  {argv[i]}")
            i += 1
    return "\n".join(lines + [")"]) + "\n"


def launch_script(placement, entry: str, args_ref: str = "", megatron: bool = False,
                  supplies: tuple[Supply, ...] = (), cd: str | None = None) -> str:
    """torchrun per node: static rendezvous, node rank = hostfile order; torch elastic gives agent k the
    global ranks after the local world sizes of agents 0..k-1 (agent/server/api.py _assign_worker_ranks)."""
    lines = ["#!/usr/bin/env bash", "# Run on every node with HAAP_NODE set to its placeholder name (see hostfile",
             "# and LAUNCH.txt).", "set -euo pipefail", 'HERE="$(cd "$(dirname "$0")" && pwd)"',
             ': "${MASTER_ADDR:?set MASTER_ADDR to the host of node rank 0}"', *require_lines(supplies),
             f"NNODES={len(placement.nodes)}", 'case "${HAAP_NODE:?}" in']
    for k, n in enumerate(placement.nodes):
        lines.append(f"  {n.name}) NODE_RANK={k}; NPROC={n.nproc}; export CUDA_VISIBLE_DEVICES="
                     f"{','.join(map(str, n.devices))} ;;")
    lines += ['  *) echo "unknown HAAP_NODE=$HAAP_NODE" >&2; exit 2 ;;', "esac",
              '[ -f "$HERE/nccl_env.sh" ] && source "$HERE/nccl_env.sh"',
              *(["export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron: required with tp/cp > 1 (arguments.py)"]
                if megatron else []),
              *([args_ref] if args_ref else []), *([f'cd "{cd}"'] if cd else []),
              "torchrun --nnodes=$NNODES --node-rank=$NODE_RANK --nproc-per-node=$NPROC --rdzv-backend=static \\",
              f"  --master-addr=$MASTER_ADDR --master-port=${{MASTER_PORT:-6000}} {entry}"]
    return "\n".join(lines) + "\n"


def emit(plan: Plan, cluster, model: ModelSpec, training=None) -> dict[str, str]:
    """megatron_args.sh, launch.sh, hostfile, rank_map.json (EmitError when Megatron cannot run the plan)."""
    viol = plan_violations(plan, model)
    if viol:
        raise EmitError("Megatron-LM cannot run this plan: " + "; ".join(v.message for v in viol))
    placement = place(plan, cluster)
    argv = build_args(plan, model)
    return {
        "megatron_args.sh": _args_file(plan, model, argv),
        "launch.sh": launch_script(placement, 'pretrain_gpt.py "${MEGATRON_ARGS[@]}" \\\n    --data-path "$DATA_PATH" '
                                   '--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL" \\\n'
                                   '    --save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" ${MEGATRON_EXTRA_ARGS:-}',
                                   'source "$HERE/megatron_args.sh"', megatron=True, supplies=SUPPLIES,
                                   cd="$MEGATRON_LM"),
        "LAUNCH.txt": launch_text("megatron", ENGINE_VERSION, placement, SUPPLIES, NOTES),
        "hostfile": placement.hostfile(),
        "rank_map.json": placement.rank_map_json(),
    }
