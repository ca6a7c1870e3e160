"""FLOP counts: closed forms of Narayanan et al. (SC'21), Megatron, 6·N·D, and a parameter-count oracle."""

from __future__ import annotations

import pytest
from estimator_helpers import GPT_18B, LLAMA_70B, MOE
from hypothesis import given, settings
from hypothesis import strategies as st

from haap_milp.estimator import flops
from haap_milp.specs import ModelSpec


@pytest.mark.parametrize("batch,seq", [(1, 2048), (16, 2048), (8, 4096)])
def test_sc21_closed_form_with_full_recompute(batch, seq):
    """SC'21 eq. (3) counts 4 passes of the layers (full recompute) and 3 of the LM head, full-square attention."""
    m = GPT_18B
    layer = flops.dense_layer_flops(m, batch * seq, seq, causal=False)
    ours = m.num_layers * layer.hardware("full") + flops.head_flops(m, batch * seq).model
    ref = flops.narayanan_sc21_flops(batch, seq, m.num_layers, m.hidden, m.vocab_size)
    assert ours == pytest.approx(ref, rel=0.01)


def test_megatron_model_flops_without_recompute():
    m = GPT_18B
    ours = m.num_layers * flops.dense_layer_flops(m, 2048, 2048, causal=False).model + flops.head_flops(m, 2048).model
    assert ours == pytest.approx(flops.megatron_model_flops(1, 2048, m.num_layers, m.hidden, m.vocab_size), rel=0.01)


def test_six_n_d_for_a_large_dense_model():
    """6·N·tokens within 5% for a 70B model at 4k context (causal attention adds ~4%)."""
    seq = 4096
    ours = flops.model_flops_per_sample(LLAMA_70B, seq)
    assert ours == pytest.approx(flops.six_n_flops(LLAMA_70B.num_params_total, seq), rel=0.05)


def test_recompute_counts():
    layer = flops.dense_layer_flops(LLAMA_70B, 4096, 4096)
    assert layer.hardware("none") == layer.model
    assert layer.hardware("selective") == pytest.approx(layer.model + layer.attn_fwd)
    assert layer.hardware("full") == pytest.approx(layer.model * 4 / 3)


def test_causal_halves_scores_only():
    a, b = (flops.dense_layer_flops(LLAMA_70B, 4096, 4096, causal=c) for c in (True, False))
    assert a.gemm_fwd == b.gemm_fwd and a.attn_fwd == pytest.approx(b.attn_fwd / 2)


def _oracle_layer_fwd(m: ModelSpec, i: int, tokens: int, seq: int) -> float:
    """Independent count from the specs' parameter counts: 2 FLOPs per weight per (active) token + scores."""
    weights = m.layer_params(i, active=True) - 2 * m.hidden  # norms have no matmul
    scores = 2 * 2 * tokens * seq * m.num_heads * m.dim_head * 0.5
    return 2 * tokens * weights + scores


def test_moe_layer_matches_parameter_oracle():
    tokens = seq = 1024
    moe = flops.moe_layer_flops(MOE, tokens, seq)
    dense = flops.dense_layer_flops(MOE, tokens, seq)
    assert moe.gemm_fwd + moe.attn_fwd == pytest.approx(_oracle_layer_fwd(MOE, 5, tokens, seq), rel=1e-9)
    assert dense.gemm_fwd + dense.attn_fwd == pytest.approx(_oracle_layer_fwd(MOE, 0, tokens, seq), rel=1e-9)
    mean = flops.mean_layer_flops(MOE, tokens, seq)
    frac = MOE.num_moe_layers / MOE.num_layers
    assert mean.model == pytest.approx(frac * moe.model + (1 - frac) * dense.model)


@settings(max_examples=40, deadline=None)
@given(h=st.sampled_from([256, 512, 1024]), heads=st.sampled_from([4, 8, 16]), kv=st.sampled_from([1, 2, 4]),
       ffn=st.integers(256, 4096), act=st.sampled_from(["swiglu", "gelu"]), seq=st.sampled_from([128, 512, 2048]),
       b=st.integers(1, 8))
def test_dense_layer_matches_parameter_oracle(h, heads, kv, ffn, act, seq, b):
    m = ModelSpec(name="x", num_layers=2, hidden=h, ffn_hidden=ffn, num_heads=heads, num_kv_heads=kv,
                  vocab_size=1000, activation=act)
    got = flops.dense_layer_flops(m, b * seq, seq)
    assert got.gemm_fwd + got.attn_fwd == pytest.approx(_oracle_layer_fwd(m, 0, b * seq, seq), rel=1e-9)
