"""Issue 15's all-dimensions-on speed-ups are exact: the estimator's shared DP-sync cache (eq. O2f) and presolve's
exact-twin rule (eq. O1f) change no price and no optimum."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from haap_milp import presolve
from haap_milp.catalog import load_cluster, load_model
from haap_milp.errors import HaapInputError
from haap_milp.estimator.cost_model import Estimator
from haap_milp.specs import SolveOptions, TrainingSpec


def _prices(est, gpu, tp, dp, ep, etp, rc, b, cp, z):
    args = (gpu, tp, dp, ep, etp, rc, b)
    kw = {"cp": cp, "zero": z}
    return (est.layer_cost(*args, **kw), est.first_stage_extra(*args, **kw), est.last_stage_extra(*args, **kw))


def _or_refusal(fn):
    try:
        return fn()
    except HaapInputError as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize("model", ["mixtral-8x7b", "llama3-8b"])
def test_shared_sync_cache_prices_every_option_as_a_fresh_estimator(model):
    """Eq. O2f: one estimator pricing many options (sharing the DP sync across recompute and micro-batch) gives each
    option exactly the prices of a fresh estimator that prices only it; options that differ only in dp, zero, cp or
    etp must not share a sync (the test fails if the cache key drops one of them)."""
    m, c = load_model(model), load_cluster("h100-80g:16")
    tr = TrainingSpec(global_batch_size=64, seq_len=4096)
    shared = Estimator(m, c, tr)
    etps = (1, 2) if m.is_moe else (1,)
    eps = (1, 8) if m.is_moe else (1,)
    grid = [(tp, dp, ep, etp, rc, b, cp, z)
            for tp, dp, ep, etp, rc, b, cp, z in itertools.product((1, 2), (1, 2, 4), eps, etps, ("none", "full"),
                                                                   (4, 8), (1, 2), (0, 1, 3))
            if b % dp == 0 and (tp * dp * cp) % (ep * etp) == 0]
    for g in grid:  # a combination the estimator refuses must be refused alike
        got = _or_refusal(lambda: _prices(shared, "h100-80g", *g))  # noqa: B023 - called at once
        want = _or_refusal(lambda: _prices(Estimator(m, c, tr), "h100-80g", *g))  # noqa: B023
        assert got == want, g
    assert shared.cache_stats()["param_sync_hits"] > 0  # the cache is used


def _all_on_problem():
    m, c = load_model("llama3-8b"), load_cluster("h100-80g:8,a100-80g:8")
    tr = TrainingSpec(global_batch_size=32, seq_len=4096)
    opts = SolveOptions(vpp="auto", zero="auto", cp="auto", etp="auto", mixed_stages="on")
    return presolve.build(m, c, tr, opts, Estimator(m, c, tr)).problem


def test_subset_problem_reuses_the_memory_tables_and_they_equal_fresh_ones():
    """Eq. S2f: the planner's variant subset (a new Problem sharing the options and Variant objects) reads the memory
    tables the full problem built, relabelled to its own indices, and they equal tables built from scratch; eq. S1f:
    an interleaved copy's tables have num_stages slots."""
    from dataclasses import replace

    from haap_milp.solvers.common import slot_bounds

    prob = _all_on_problem()
    copies = [v for v, var in enumerate(prob.variants) if var.vpp > 1]
    assert copies
    keep = [0, copies[-1]]
    sub = replace(prob, variants=tuple(prob.variants[i] for i in keep))
    full_t = slot_bounds.build_tables(prob, keep[1])
    assert full_t.K == min(prob.variants[keep[1]].num_stages, prob.max_stages, prob.num_layers)
    sub_t = slot_bounds.build_tables(sub, 1)
    assert sub_t.v == 1 and sub_t.U_mem is full_t.U_mem  # shared, not rebuilt
    slot_bounds._MEMO.__dict__.clear()
    fresh = slot_bounds.build_tables(sub, 1)
    for k in ("U_mem", "Uf_mem", "lo", "lof", "opts", "U", "Uf"):
        assert np.array_equal(getattr(fresh, k), getattr(sub_t, k)), k
    assert (fresh.p_min, fresh.p_max) == (sub_t.p_min, sub_t.p_max)
    other = replace(prob, max_stages=prob.max_stages - 1)  # another problem: never the cached tables
    assert slot_bounds.build_tables(other, keep[1]).U_mem is not full_t.U_mem

