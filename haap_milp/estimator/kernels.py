"""Kernel choices of the training engine that change time and memory (not silicon, not the plan)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Implementation:
    """``flash_attention``: fused attention that never stores the s x s scores (Megatron-Core/TE,
    torchtitan SDPA, llm-foundry; default). False: the 2021 Megatron path (batched QK^T and AV GEMMs,
    fused scale-mask-softmax, dropout on the scores; Korthikanti et al. Table 2's 5·a·s²·b term).
    ``dropout``: dropout on attention scores / block outputs (GPT-3-era configs; Llama-style pretraining
    uses none). ``logit_bytes``: bytes per output logit kept by the loss for one micro-batch: 4 for
    Megatron's fused vocab-parallel cross-entropy (fp32 logits, gradient computed in place; Megatron
    theoretical_memory_usage.py: 4·s·b·V/t); 10 for an unfused PyTorch loss (bf16 logits 2 + fp32 upcast 4
    + fp32 gradient 4; torchtitan computes ``cross_entropy(pred.float(), ...)``)."""

    flash_attention: bool = True
    dropout: bool = False
    logit_bytes: float = 4.0


MODERN = Implementation()
MEGATRON_2021 = Implementation(flash_attention=False, dropout=True)
TORCH_EAGER_LOSS = Implementation(logit_bytes=10.0)
