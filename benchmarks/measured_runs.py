"""Published measured runs (benchmarks/data/measured_runs.json) as specs + plan + the metric to predict.

Used by ``benchmarks/calibrate.py`` (fit), ``benchmarks/validate_estimator.py`` (table) and the tests.
Every assumption a row needs is listed in ``Run.assumptions``; a row is *complete* when the model,
the full parallel mapping, the micro-batch and a time-like metric are given (or follow from a stated
convention), its GPU type is modelled and nothing in it is outside the model (sliding windows, GB200 NVL72
domains; MLA is modelled when the row gives its ranks and head dims). A row's ``config_gaps`` (a setting the source
leaves out that the run cannot have lacked) makes it incomplete. Measured times are taken as the source reports them:
iteration time; else global batch x sequence / tokens per second; else the source's own FLOP formula
/ its TFLOP/s (SC'21: 96·B·s·l·h²·(1 + s/6h + V/16lh), hardware FLOPs).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from haap_milp.estimator import comm
from haap_milp.estimator.calibration import Calibration
from haap_milp.estimator.compute import optimizer_step_s
from haap_milp.estimator.cost_model import Estimator
from haap_milp.estimator.costs import grad_bytes
from haap_milp.estimator.flops import narayanan_sc21_flops
from haap_milp.estimator.kernels import MEGATRON_2021, MODERN, Implementation
from haap_milp.pipeline import GIB
from haap_milp.specs import ClusterSpec, GPUSpec, ModelSpec, NodeGroup, Plan, StagePlan, TrainingSpec

GPU_NAMES = {"A100-SXM4-80GB": "a100-80g", "A100-SXM4-40GB": "a100-40g", "H100-SXM5-80GB": "h100-80g"}
NVIDIA_RECIPES = ("dgxc_", "nemo", "mb2")  # NeMo / Megatron-Bridge performance recipes
GPT_VOCAB = 51200  # NeMo LLM_VOCAB_SIZE_MAP['gpt3'] (GPT-2 BPE padded to a multiple of 1024): rows that omit it


@dataclass
class Run:
    """One measured row mapped to haap's vocabulary."""

    row: dict[str, Any]
    model: ModelSpec | None = None
    cluster: ClusterSpec | None = None
    training: TrainingSpec | None = None
    plan: Plan | None = None
    measured_time_s: float | None = None
    metric: str = ""
    fsdp: bool = False
    complete: bool = True
    assumptions: list[str] = field(default_factory=list)
    excluded: str = ""  # why the row cannot be predicted at all
    impl: Implementation = MODERN

    @property
    def id(self) -> str:
        return self.row["id"]

    @property
    def gpu(self) -> str:
        return GPU_NAMES.get(self.row["gpu"].split(" (")[0], self.row["gpu"])

    @property
    def category(self) -> str:
        return self.row["category"]


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _activation(name: str) -> str:
    n = name.lower()
    if "nemotron" in n:
        return "relu"  # squared ReLU, 2 matrices
    if any(k in n for k in ("llama", "qwen", "grok", "deepseek", "gpt-oss", "mixtral")):
        return "swiglu"  # Grok-1's GeGLU also has 3 matrices
    return "gelu"


def _model(run: Run) -> ModelSpec | None:
    m = run.row["model"]
    if any(m.get(k) is None for k in ("layers", "hidden", "heads", "seq_len")):
        run.excluded = "model architecture incomplete"
        return None
    if m.get("vocab") is None:
        if _activation(m["name"]) != "gelu":
            run.excluded = "vocabulary size not given"
            return None
        run.assumptions.append(f"vocab={GPT_VOCAB} (GPT default)")
    ffn = m.get("ffn_hidden")
    if ffn is None and not m.get("num_experts"):
        ffn = 4 * m["hidden"]
        run.assumptions.append("ffn=4h")
    notes = m.get("arch_notes") or ""
    mla = _mla_fields(notes) if ("MLA" in m["name"] or "MLA" in notes) else {}
    if mla is None:
        run.excluded = "MLA dims (q_lora, kv_lora, qk_nope, qk_rope, v_head) not all given in the row"
        return None
    head_dim = re.search(r"kv_channels (\d+)", notes)
    if head_dim is None and "qwen3" in m["name"].lower():
        run.excluded = "Qwen3 head_dim (kv_channels) not given in the row"
        return None
    fields: dict[str, Any] = {
        "name": m["name"], "num_layers": m["layers"], "hidden": m["hidden"], "ffn_hidden": ffn or m["moe_ffn_hidden"],
        "num_heads": m["heads"], "num_kv_heads": m.get("kv_heads"), "vocab_size": m.get("vocab") or GPT_VOCAB,
        "seq_len": m["seq_len"], "activation": _activation(m["name"]),
        "head_dim": int(head_dim[1]) if head_dim else None}
    if m.get("num_experts"):
        fields.update(num_experts=m["num_experts"], top_k=m["top_k"], moe_ffn_hidden=m["moe_ffn_hidden"],
                      num_shared_experts=m.get("shared_experts") or 0)
        dense = re.search(r"first (\d+) layers dense", notes)
        if dense:
            fields.update(moe_layer_pattern="first_k_dense", first_k_dense=int(dense[1]))
    if mla:
        fields.update(mla, head_dim=None)
    return ModelSpec(**fields)


def _mla_fields(notes: str) -> dict[str, int] | None:
    """ModelSpec's MLA fields from a row's arch_notes ('MLA q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64,
    v_head 128'); None when one of kv_lora, qk_nope, qk_rope, v_head is missing (q_lora may be absent: no
    query compression, as in DeepSeek-V2-Lite)."""
    got = {k: re.search(rf"{k} (\d+)", notes) for k in ("q_lora", "kv_lora", "qk_nope", "qk_rope", "v_head")}
    if any(got[k] is None for k in ("kv_lora", "qk_nope", "qk_rope", "v_head")):
        return None
    out = {"kv_lora_rank": int(got["kv_lora"][1]), "qk_nope_head_dim": int(got["qk_nope"][1]),
           "qk_rope_head_dim": int(got["qk_rope"][1]), "v_head_dim": int(got["v_head"][1])}
    if got["q_lora"]:
        out["q_lora_rank"] = int(got["q_lora"][1])
    return out


def _gpu_and_cluster(run: Run) -> ClusterSpec | None:
    from haap_milp.catalog.data import gpu_entry  # the catalog is data; imported lazily (one-way imports)

    if run.gpu not in GPU_NAMES.values():
        run.excluded = f"GPU {run.row['gpu']!r} is not calibrated/modelled"
        return None
    entry = gpu_entry(run.gpu)
    gpu: GPUSpec = entry.spec
    n = run.row["num_gpus"]
    if not n:
        run.excluded = "number of GPUs not given"
        return None
    node = entry.default_node
    group = NodeGroup(gpu=gpu, num_nodes=max(1, n // node.gpus_per_node), gpus_per_node=node.gpus_per_node,
                      nic=node.nic, nic_bandwidth_gbps=node.nic_bandwidth_gbps)
    return ClusterSpec(name=f"{n}x{run.gpu}", node_groups=(group,))


def _precision(text: str | None) -> str:
    t = (text or "bf16").lower()
    return "fp8" if "fp8" in t else "fp16" if t.startswith("fp16") else "bf16"


# the module names sources write inside "selective (...)" -> Megatron-Core --recompute-modules names
MODULE_ALIASES = {"norm": "layernorm", "layernorm": "layernorm", "act": "moe_act", "moe_act": "moe_act",
                  "moe": "moe", "mlp": "mlp", "shared_expert": "shared_experts", "shared_experts": "shared_experts",
                  "core_attn": "core_attn", "mla_up_proj": "mla_up_proj"}


def _recompute(run: Run) -> str:
    r = run.row.get("recompute")
    if r is None:
        run.assumptions.append("recompute=none (not stated)")
        return "none"
    return recompute_mode(run.row)


def recompute_mode(row: dict[str, Any]) -> str:
    """haap's recompute mode of a row: torchtitan's 'selective' is op-level SAC (haap's ``op``) where the row says
    op-level or names no option (torchtitan's llama3 train_configs set ``selective_ac_option = 'op'``); its
    per-layer option stays ``selective`` (not modelled as such)."""
    r = row.get("recompute") or "none"
    if r.startswith("full"):
        return "full"
    if not r.startswith("selective"):
        return "none"
    if "op-level" in r or (stack(row) == "torchtitan" and r == "selective"):
        return "op"
    return "selective"


def recompute_modules(text: str | None) -> tuple[str, ...] | None:
    """'selective (norm, act)' -> ('layernorm', 'moe_act'); None where the row names no modules (Megatron's
    default set, core_attn, applies) or a module this table does not know."""
    m = re.search(r"\(([^)]*)\)", text or "")
    if m is None:
        return None
    names = [MODULE_ALIASES.get(n.strip().lower()) for n in m[1].split(",")]
    return tuple(sorted(set(names))) if all(names) else None


def stack(row: dict[str, Any]) -> str:
    """Software-stack family of a row (for the validation breakdown): megatron-2021/22 (Megatron-LM / DeepSpeed
    before Megatron-Core), megatron-core (NeMo, Megatron-Bridge, Megatron-Core), torchtitan, llm-foundry,
    maxtext, nemo-automodel (PyTorch FSDP2 + TE + DeepEP), other."""
    f = (row.get("framework") or "").lower()
    if "megatron-lm (" in f or "deepspeed" in f:
        return "megatron-2021/22"
    for key, name in (("torchtitan", "torchtitan"), ("llm-foundry", "llm-foundry"), ("maxtext", "maxtext"),
                      ("automodel", "nemo-automodel")):
        if key in f:
            return name
    return "megatron-core" if any(k in f for k in ("nemo", "megatron")) else "other"


def bf16_grad_recipe(row: dict[str, Any]) -> bool:
    """Whether the row ran one of NVIDIA's NeMo 2 (container >= 24.09) or Megatron-Bridge performance recipes, which
    keep the DDP main gradients in bf16: ``recipe.trainer.plugins.grad_reduce_in_fp32 = False`` in NeMo's
    ``pretrain_performance_optimizations`` (e.g. nemo/collections/llm/recipes/nemotron4_340b.py) and
    ``cfg.ddp.grad_reduce_in_fp32 = False`` in Megatron-Bridge's scripts/performance configs (Llama 3.1, Qwen3,
    DeepSeek-V3 families). NeMo 24.07 (NeMo 1 launcher configs) and non-NVIDIA rows keep Megatron's fp32 default."""
    f = row.get("framework") or ""
    if "Megatron-Bridge" in f:
        return True
    m = re.search(r"NeMo(?: Megatron)? (\d\d)\.(\d\d|x)", f)
    return bool(m) and row["id"].startswith(NVIDIA_RECIPES) and (m[1], m[2]) >= ("24", "09")


def dispatcher(row: dict[str, Any]) -> str:
    """The MoE token dispatcher a row names (framework/notes text): DeepEP / HybridEP -> flex, A2A -> alltoall;
    else Megatron-Core's default, alltoall."""
    text = f"{row.get('framework') or ''} {row.get('notes') or ''}".lower()
    return "flex" if ("deepep" in text or "hybridep" in text) else "alltoall"


def _measured_time(run: Run, model: ModelSpec) -> None:
    r, me = run.row, run.row["measured"]
    gbs, seq, n = r["global_batch"], model.seq_len, r["num_gpus"]
    if me.get("iteration_time_s"):
        run.measured_time_s, run.metric = me["iteration_time_s"], "iteration_time_s"
    elif gbs and me.get("tokens_per_s"):
        run.measured_time_s, run.metric = gbs * seq / me["tokens_per_s"], "tokens_per_s"
    elif gbs and me.get("tokens_per_s_per_gpu"):
        run.measured_time_s, run.metric = gbs * seq / (me["tokens_per_s_per_gpu"] * n), "tokens_per_s_per_gpu"
    elif gbs and me.get("tflops_per_gpu") and r["id"].startswith("sc21"):
        flops = narayanan_sc21_flops(gbs, seq, model.num_layers, model.hidden, model.vocab_size)
        run.measured_time_s, run.metric = flops / (me["tflops_per_gpu"] * 1e12 * n), "tflops_per_gpu (SC'21 formula)"
    else:
        run.excluded = "no time-like metric with a known FLOP convention"


def _split(layers: int, pp: int) -> list[int]:
    base, extra = divmod(layers, pp)
    return [base + (1 if j < extra else 0) for j in range(pp)]


def _plan(run: Run, model: ModelSpec, cluster: ClusterSpec) -> tuple[Plan, TrainingSpec] | None:
    r = run.row
    tp, pp, cp, vpp = r.get("tp") or 1, r.get("pp") or 1, r.get("cp") or 1, r.get("vpp") or 1
    ep, etp = r.get("ep") or 1, r.get("etp") or 1
    n = r["num_gpus"]
    if n % (tp * pp * cp):
        run.excluded = f"num_gpus={n} is not a multiple of tp*pp*cp"
        return None
    dp = n // (tp * pp * cp)
    mbs, gbs = r.get("micro_batch"), r.get("global_batch")
    if not mbs or not gbs:
        run.excluded = "micro-batch or global batch not given"
        return None
    if gbs % (mbs * dp):
        run.excluded = f"global batch {gbs} not divisible by mbs*dp={mbs * dp}"
        return None
    run.fsdp = bool(r.get("fsdp"))
    sp = r.get("sequence_parallel")
    if sp is None:
        sp = tp > 1
        run.assumptions.append(f"sequence_parallel={sp} (not stated)")
    dist = r.get("distributed_optimizer")
    if dist is None:
        dist = True
        run.assumptions.append("distributed optimizer (not stated)")
    recompute = _recompute(run)
    fp32_grads = r.get("grad_reduce_in_fp32")  # stated by the row (its derived_fields say where from)
    if fp32_grads is None and bf16_grad_recipe(r):
        fp32_grads = False
        run.assumptions.append("grad_reduce_in_fp32=False (NVIDIA performance-recipe setting, not in the row)")
    opt = {"optimizer_state_bytes_per_param": r["optimizer_state_bytes"]} if r.get("optimizer_state_bytes") else {}
    training = TrainingSpec(global_batch_size=gbs, seq_len=model.seq_len, precision=_precision(r.get("precision")),
                            sequence_parallel=bool(sp), distributed_optimizer=bool(dist or run.fsdp),
                            memory_headroom_fraction=0.0, grad_reduce_in_fp32=fp32_grads, **opt)
    pos, stages = 0, []
    for nl in _split(model.num_layers, pp):
        stages.append(StagePlan(first_layer=pos, num_layers=nl, gpu_type=run.gpu, tp=tp, dp=dp, ep=ep, etp=etp,
                                recompute=recompute))
        pos += nl
    plan = Plan(model=model.name, cluster=cluster.name, stages=tuple(stages), micro_batch_size=mbs,
                num_microbatches=gbs // (mbs * dp), global_batch_size=gbs, seq_len=model.seq_len,
                precision=training.precision, schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp, cp=cp,
                sequence_parallel=bool(sp), distributed_optimizer=training.distributed_optimizer)
    return plan, training


def to_run(row: dict[str, Any]) -> Run:
    run = Run(row)
    run.model = _model(run)
    if run.model is None:
        run.complete = False
        return run
    run.cluster = _gpu_and_cluster(run)
    if run.cluster is not None:
        _measured_time(run, run.model)
    built = _plan(run, run.model, run.cluster) if run.cluster is not None and not run.excluded else None
    if built is None:
        run.complete = False
        return run
    run.plan, run.training = built
    if "2021" in (row.get("framework") or "") or row["id"].startswith("mtnlg"):
        run.impl = MEGATRON_2021  # pre-flash-attention Megatron, GPT-3-style dropout
    modules = recompute_modules(row.get("recompute"))
    if modules:
        run.impl = replace(run.impl, recompute_modules=modules)
    if run.model.is_moe:
        run.impl = replace(run.impl, moe_dispatcher=dispatcher(row))
    if row.get("recompute") is None and not row["id"].startswith(NVIDIA_RECIPES):
        run.complete = False  # only NVIDIA's published recipes document "no recompute unless listed"
    for gap in row.get("config_gaps") or ():  # a setting the source leaves out that the run cannot have lacked
        run.complete = False
        run.assumptions.append(f"config gap: {gap}")
    return run


def fsdp_time_s(est: Estimator, plan: Plan, stage_time_s: float, contention: bool = True) -> float:
    """FSDP (ZeRO-3) rows: every micro-batch all-gathers the 16-bit parameters for forward and backward and
    reduce-scatters the gradients (PyTorch FSDP / Megatron-FSDP; prefetching overlaps them with compute), so a
    micro-batch takes max(compute, communication), plus (``contention``) the overlapped span's slow-down,
    κ·min(compute, communication) (eq. Z4b, ``comm.overlap_contention_s``); plus the sharded optimizer step. Expert
    parameters are already split over ep, so only their per-GPU share is gathered."""
    s = plan.stages[0]
    hw = est.hardware(s.gpu_type)
    layer = est.layer_cost(s.gpu_type, s.tp, s.dp, s.ep, s.etp, "none", plan.samples_per_microbatch, cp=plan.cp)
    first = est.first_stage_extra(s.gpu_type, s.tp, s.dp, s.ep, s.etp, "none", plan.samples_per_microbatch,
                                  cp=plan.cp)
    last = est.last_stage_extra(s.gpu_type, s.tp, s.dp, s.ep, s.etp, "none", plan.samples_per_microbatch,
                                cp=plan.cp)
    params = (est.model.num_layers * layer.weights_bytes + first.weights_bytes + last.weights_bytes) / 2.0
    n = s.dp * plan.cp
    ag = comm.group_collective("all_gather", n, s.tp, hw.gpus_per_node, hw.nvlink, hw.nic_node)
    rs = comm.group_collective("reduce_scatter", n, s.tp, hw.gpus_per_node, hw.nvlink, hw.nic_node)
    per_mb = 2 * ag.time(2.0 * params) + rs.time(grad_bytes(plan.precision, est.training.grad_reduce_in_fp32) * params)
    k = est.calibration.globals.overlap_slowdown if contention else 0.0
    per_mb_s = max(stage_time_s, per_mb) + comm.overlap_contention_s(per_mb, stage_time_s, k)
    return plan.num_microbatches * per_mb_s + optimizer_step_s(params / n, hw.gpu, hw.params)


def estimator_for(run: Run, calibration: Calibration | None = None) -> Estimator:
    return Estimator(run.model, run.cluster, run.training, calibration, impl=run.impl, p2p_model="per_gpu")


def predict_time_s(run: Run, est: Estimator) -> float:
    """Predicted iteration time of a complete-enough run with estimator ``est``."""
    pe = est.estimate(run.plan)
    if run.fsdp and run.plan.pp == 1:  # Megatron-FSDP (the one megatron-core FSDP row): no contention term
        return fsdp_time_s(est, run.plan, pe.stages[0].time_s, contention=stack(run.row) != "megatron-core")
    return pe.iteration_time_s


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured if measured else math.nan


def fsdp_memory_bytes(model: ModelSpec, training: TrainingSpec, tp: int, shards: int, micro_batch: int,
                      recompute: str, cp: int = 1, impl: Implementation = MODERN, overhead_bytes: float = 0.0,
                      frag_fraction: float = 0.0) -> float:
    """Peak memory per GPU of a PyTorch FSDP (ZeRO-3) run without pipeline: sharded fp32 master
    parameters, fp32 gradients and Adam m, v (4 + 4 + 8 bytes per parameter over ``shards``); the current
    and the prefetched layer unsharded in bf16, with the current layer's unsharded gradient (2·2 + 4 bytes
    per layer parameter); activations of every layer for one micro-batch, the input ids and the output
    layer + loss (memory.py); plus the framework overhead and the allocator fragmentation (a share of the
    largest allocation, memory.fragmentation_bytes)."""
    from haap_milp.estimator import memory

    sp = training.sequence_parallel and tp > 1
    per_layer = memory.dense_layer_params_per_gpu(model, tp)
    total = (model.num_layers * per_layer + (model.embedding_params + model.head_params) / tp)
    static = total * 16.0 / shards + per_layer * (2 * 2 + 4)
    args = (model, False, micro_batch, model.seq_len, tp, sp, recompute, cp, 1, impl)
    act = model.num_layers * memory.layer_activation_bytes(*args) + memory.recompute_working_bytes(*args)
    act += memory.embedding_activation_bytes(micro_batch, model.seq_len, cp)
    act += memory.head_activation_bytes(model, micro_batch, model.seq_len, tp, cp, impl)
    big = memory.largest_allocation_bytes(model, micro_batch, model.seq_len, tp, cp, 1, impl, head=True)
    return static + act + overhead_bytes + memory.fragmentation_bytes(big, frag_fraction)


@dataclass
class MemoryCase:
    """A published peak and haap's prediction without fragmentation (``base``) plus the largest allocation."""

    id: str
    measured: float  # bytes
    base: float  # predicted bytes, frag_fraction = 0
    largest: float  # bytes
    mapped: bool  # the run's recomputation maps onto haap's (full activation checkpointing, op-level SAC)
    recompute: str = "full"  # haap's mode for it

    def predicted(self, frag_fraction: float) -> float:
        return self.base + frag_fraction * self.largest


def memory_cases(rows: list[dict[str, Any]], overhead_bytes: float) -> list[MemoryCase]:
    """The torchtitan FSDP peak-memory rows. Full activation checkpointing and op-level SAC (``recompute_mode``:
    torchtitan's 'selective' is op-level, haap's ``op``) map onto haap's recompute modes: those are ``mapped``."""
    from haap_milp.estimator import memory
    from haap_milp.estimator.kernels import TORCH_EAGER_LOSS

    out = []
    for row, model, measured in memory_rows(rows):
        tp, cp = row.get("tp") or 1, row.get("cp") or 1
        rec = recompute_mode(row)
        training = TrainingSpec(global_batch_size=row["global_batch"], seq_len=model.seq_len, sequence_parallel=True)
        base = fsdp_memory_bytes(model, training, tp, row["num_gpus"] // tp, row["micro_batch"], rec, cp,
                                 TORCH_EAGER_LOSS, overhead_bytes)
        big = memory.largest_allocation_bytes(model, row["micro_batch"], model.seq_len, tp, cp, 1, TORCH_EAGER_LOSS,
                                              head=True)
        out.append(MemoryCase(row["id"], measured, base, big, rec in ("full", "op"), rec))
    return out


def fit_frag_fraction(cases: list[MemoryCase], exclude: str | None = None) -> float:
    """Least squares of the mapped rows' shortfall (measured - base) on their largest allocation, in [0, 4]."""
    use = [c for c in cases if c.mapped and c.id != exclude]
    den = sum(c.largest**2 for c in use)
    k = sum((c.measured - c.base) * c.largest for c in use) / den if den else 0.0
    return min(4.0, max(0.0, k))


def fit_frag_constant(cases: list[MemoryCase], exclude: str | None = None) -> float:
    """The alternative the share is validated against: fragmentation as one constant (bytes), the mean shortfall
    of the mapped rows."""
    use = [c.measured - c.base for c in cases if c.mapped and c.id != exclude]
    return max(0.0, sum(use) / len(use)) if use else 0.0


def memory_rows(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], ModelSpec, float]]:
    """Rows with a measured peak memory whose model is complete: (row, model, measured bytes)."""
    out = []
    for row in rows:
        gb = row["measured"].get("memory_gb")
        if gb is None:
            continue
        run = Run(row)
        model = _model(run)
        if model is not None:
            unit = GIB if row["measured"].get("memory_unit") == "GiB" else 1e9
            out.append((row, model, gb * unit))
    return out
