"""Kernel and engine choices that change time and memory (not silicon, not the plan)."""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.errors import HaapInputError

# Megatron-Core's selective-recompute module set (``--recompute-granularity selective --recompute-modules``;
# megatron/core/transformer/transformer_config.py ``recompute_modules``, default ["core_attn"]).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
# Megatron-Core ``--moe-token-dispatcher-type``: alltoall, allgather, flex (DeepEP / HybridEP backend).
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")


@dataclass(frozen=True)
class Implementation:
    """``flash_attention``: fused attention that never stores the s x s scores (Megatron-Core/TE,
    torchtitan SDPA, llm-foundry; default). False: the 2021 Megatron path (batched QK^T and AV GEMMs,
    fused scale-mask-softmax, dropout on the scores; Korthikanti et al. Table 2's 5·a·s²·b term).
    ``dropout``: dropout on attention scores / block outputs (GPT-3-era configs; Llama-style pretraining
    uses none). ``logit_bytes``: bytes per output logit kept by the loss for one micro-batch: 4 for
    Megatron's fused vocab-parallel cross-entropy (fp32 logits, gradient computed in place; Megatron
    theoretical_memory_usage.py: 4·s·b·V/t); 10 for an unfused PyTorch loss (bf16 logits 2 + fp32 upcast 4
    + fp32 gradient 4; torchtitan computes ``cross_entropy(pred.float(), ...)``).
    ``recompute_modules``: what a stage with ``recompute="selective"`` recomputes (Megatron-Core module
    names, RECOMPUTE_MODULES; memory.py and layers.py price each). ``moe_dispatcher``: the MoE token
    dispatcher (MOE_DISPATCHERS; layers.py / memory.py price its traffic and buffers).
    ``tp_saves_gathered_input``: PyTorch DTensor tensor parallelism (torchtitan's ColwiseParallel behind
    PrepareModuleInput(Shard(1) -> Replicate())) keeps the all-gathered, full-sequence input of the column-parallel
    linears for their weight gradient; Megatron's sequence parallelism keeps its sequence shard and all-gathers it
    again in the backward (Korthikanti et al. sec. 4.2.2), which is the default here."""

    flash_attention: bool = True
    dropout: bool = False
    logit_bytes: float = 4.0
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    moe_dispatcher: str = "alltoall"
    tp_saves_gathered_input: bool = False

    def recomputes(self, module: str) -> bool:
        return module in self.recompute_modules


MODERN = Implementation()
MEGATRON_2021 = Implementation(flash_attention=False, dropout=True)
TORCH_EAGER_LOSS = Implementation(logit_bytes=10.0, tp_saves_gathered_input=True)  # torchtitan (PyTorch eager loss, DTensor TP)


def parse_recompute_modules(text: str, flag: str = "--recompute-modules") -> tuple[str, ...]:
    """'layernorm,moe_act' (commas or spaces) -> a sorted tuple of known module names; unknown names refused."""
    names = tuple(sorted({n for n in text.replace(",", " ").split() if n}))
    bad = [n for n in names if n not in RECOMPUTE_MODULES]
    if not names or bad:
        raise HaapInputError(f"{flag} {text!r}: {'unknown module ' + ', '.join(map(repr, bad)) if bad else 'empty'}; "
                             f"Megatron-Core's modules are {', '.join(RECOMPUTE_MODULES)} (comma-separated).",
                             field=flag.lstrip("-").replace("-", "_"), value=text)
    return names
