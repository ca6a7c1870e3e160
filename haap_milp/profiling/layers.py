"""PyTorch modules with a model's shapes, one tensor-parallel shard each (imports torch: load lazily).

* ``embedding``: vocab-parallel ``nn.Embedding(vocab / tp, hidden)``.
* ``attention``: RMSNorm, Q/K/V projections (heads / tp query heads, kv_heads / tp key/value heads, GQA by
  repeating K/V), causal ``scaled_dot_product_attention``, output projection, residual. No rotary
  embedding (RoPE costs a few element-wise ops per token, well under 1 % of the layer's time).
* ``mlp``: RMSNorm, SwiGLU (gate + up, down: 3 matrices) or GELU/ReLU (2 matrices) with ffn / tp inner
  size, residual.
* ``decoder``: attention then mlp (one whole layer).
* ``head``: final RMSNorm, LM head ``Linear(hidden, vocab / tp)`` and cross-entropy loss; tied embeddings
  are measured as a separate head (the time is the same, the memory counts the weight twice).

With tp > 1 the row-parallel outputs (attention output and MLP down projections) are all-reduced over
the tp group (Megatron-style tensor parallelism without sequence parallelism).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from haap_milp.specs import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    if group is None:
        return x
    return _AllReduce.apply(x, group)


class _AllReduce(torch.autograd.Function):
    """Row-parallel output: all-reduce in forward, identity in backward (the column-parallel input's
    all-reduce in backward is the matching ``_Copy``)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        torch.distributed.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Copy(torch.autograd.Function):
    """Column-parallel input: identity in forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        torch.distributed.all_reduce(g, group=ctx.group)
        return g, None


def _copy(x: torch.Tensor, group) -> torch.Tensor:
    return x if group is None else _Copy.apply(x, group)


class Attention(nn.Module):
    def __init__(self, m: ModelSpec, tp: int, group=None):
        super().__init__()
        self.heads, self.kv_heads, self.dim = m.num_heads // tp, max(1, m.kv_heads // tp), m.dim_head
        self.norm = RMSNorm(m.hidden)
        self.q = nn.Linear(m.hidden, self.heads * self.dim, bias=m.qkv_bias)
        self.k = nn.Linear(m.hidden, self.kv_heads * self.dim, bias=m.qkv_bias)
        self.v = nn.Linear(m.hidden, self.kv_heads * self.dim, bias=m.qkv_bias)
        self.o = nn.Linear(self.heads * self.dim, m.hidden, bias=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = _copy(self.norm(x), self.group)
        q = self.q(h).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = self.k(h).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v(h).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        return x + _all_reduce(self.o(a), self.group)


class MLP(nn.Module):
    def __init__(self, m: ModelSpec, tp: int, group=None):
        super().__init__()
        inner = max(1, m.ffn_hidden // tp)
        self.norm = RMSNorm(m.hidden)
        self.swiglu = m.activation == "swiglu"
        self.up = nn.Linear(m.hidden, inner * (2 if self.swiglu else 1), bias=False)  # gate and up fused
        self.down = nn.Linear(inner, m.hidden, bias=False)
        self.act = F.gelu if m.activation == "gelu" else F.relu
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(_copy(self.norm(x), self.group))
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = self.act(h)
        return x + _all_reduce(self.down(h), self.group)


class Decoder(nn.Module):
    def __init__(self, m: ModelSpec, tp: int, group=None):
        super().__init__()
        self.attn, self.mlp = Attention(m, tp, group), MLP(m, tp, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


class Embedding(nn.Module):
    def __init__(self, m: ModelSpec, tp: int, group=None):
        super().__init__()
        self.emb = nn.Embedding(max(1, m.vocab_size // tp), m.hidden)
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _all_reduce(self.emb(ids), self.group)


class Head(nn.Module):
    """Final norm, LM head and loss; returns the scalar loss (vocab-parallel loss simplified: each rank
    computes the loss over its vocab shard, which costs the same as the exact vocab-parallel loss)."""

    def __init__(self, m: ModelSpec, tp: int, group=None):
        super().__init__()
        self.vocab = max(1, m.vocab_size // tp)
        self.norm = RMSNorm(m.hidden)
        self.lm = nn.Linear(m.hidden, self.vocab, bias=False)
        self.group = group

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm(_copy(self.norm(x), self.group)).float()
        return F.cross_entropy(logits.view(-1, self.vocab), labels.view(-1))


BUILDERS = {"embedding": Embedding, "decoder": Decoder, "attention": Attention, "mlp": MLP, "head": Head}


def build(kind: str, m: ModelSpec, tp: int, device: torch.device, group=None) -> nn.Module:
    """The ``kind`` module of ``m``'s shapes, one tp shard, fp32 master weights on ``device``."""
    return BUILDERS[kind](m, tp, group).to(device)


def make_inputs(kind: str, m: ModelSpec, tp: int, micro_batch: int, seq: int, device: torch.device,
                gen: torch.Generator) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """(forward arguments, gradient of the output or None when the module returns the loss)."""
    if kind == "embedding":
        ids = torch.randint(0, max(1, m.vocab_size // tp), (micro_batch, seq), generator=gen).to(device)
        return (ids,), torch.randn(micro_batch, seq, m.hidden, generator=gen).to(device)
    x = torch.randn(micro_batch, seq, m.hidden, generator=gen).to(device).requires_grad_(True)
    if kind == "head":
        labels = torch.randint(0, max(1, m.vocab_size // tp), (micro_batch, seq), generator=gen).to(device)
        return (x, labels), None
    return (x,), torch.randn(micro_batch, seq, m.hidden, generator=gen).to(device)
