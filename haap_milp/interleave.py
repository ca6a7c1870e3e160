"""Interleaved 1F1B as a search dimension (formulations/README.md, eqs. I1-I5).

A plan-wide vpp (model chunks per pipeline stage) is part of the micro-batch variant: presolve copies each
variant once per (vpp, P) with vpp in the candidates and P a stage count the interleaved schedule accepts
(eq. I5), and the solvers optimise eq. I1 on those copies. Fixing P per copy keeps eq. I4's in-flight chunks
(which depend on P) constants of each slot, so memory (eq. M3) and the round-trip rows (eq. I3) stay linear.

Eq. I5, the engine's rules (Megatron-Core 0.16, read in the installed package):
* ``megatron/core/pipeline_parallel/schedules.py`` ``forward_backward_pipelining_with_interleaving``: the
  micro-batch group ``microbatch_group_size_per_vp_stage`` (default P, ``model_parallel_config.py``) must lie in
  [P, M], and ``M % group`` must be 0 or >= P, so with the default group M is a multiple of P (M >= P);
* ``megatron/training/arguments.py`` (its rule as re-implemented in ``emit/megatron_rules.py``): interleaving
  needs pp > 2 unless ``--overlap-p2p-comm``;
so P >= 3 and P | M; and vpp <= L - P + 1, so that a split can hold a decoder layer in every virtual round
(chunk c of every stage) (``parallel_rules.vpp_fills_rounds``, the checker's ``schedule.vpp_layers``). Layers
per chunk: each stage's n_j layers are split as evenly as possible over its vpp
chunks, earlier chunks taking the remainder (``chunk_layers``); Megatron writes any such split with
``--pipeline-model-parallel-layout`` (empty chunks allowed), so the search chooses n_j per stage and the chunk
split follows. Eq. I1 prices every chunk at t_j / vpp: exact when vpp divides n_j, within one layer's time per
stage otherwise.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from haap_milp.errors import HaapInputError
from haap_milp.estimator.schedule import inflight, loss_inflight
from haap_milp.parallel_rules import vpp_fills_rounds

AUTO_CANDIDATES = (2, 3, 4)  # --vpp auto: vpp > 1 candidates (beside vpp = 1); Megatron's recipes use 2-8
MIN_STAGES = 3  # eq. I5: pp > 2 (Megatron without --overlap-p2p-comm)


MATERIAL_FILL = 0.10  # eq. D2: the default interleaves only where 1F1B's fill/drain share is at least this


def fill_share(num_microbatches: int, num_stages: int) -> float:
    """Eq. D2: 1F1B's fill/drain share of the iteration, sum t / ((M - 1) tau + sum t), at balanced stages
    (sum t = P tau): (P - 1) / (M + P - 1). Interleaving (eq. I1) shrinks the fill term to sum t / vpp, so it
    saves at most (1 - 1/vpp) times this share."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def default_vpp(asked, num_microbatches: list[int], max_stages: int, num_layers: int):
    """Eq. D2: ``--vpp`` left unset ("default") searches interleaving (auto) only when the deepest pipeline the
    interleaved schedule accepts at the *most* micro-batches any variant has (M*, the smallest micro-batch)
    still has a fill/drain share >= MATERIAL_FILL; otherwise vpp 1 (no interleaved variants). Why: eq. I1's
    saving is at most (1 - 1/vpp) * fill_share, i.e. < 7.5 % below a 10 % share even at vpp 4, before the
    extra (vpp - 1) p2p hops per micro-batch and chunk and the 2-5x solve time the interleaved copies cost;
    and when M* keeps the deepest pipeline's bubble small, the search can already shrink the bubble by taking
    smaller micro-batches. ``num_microbatches``: the M of the variants that can occupy the cluster
    (``occupying_microbatches``). Small batches on deep pipelines (gbs 16 over 16+ stages: share ~0.48) and wide
    clusters (hetero3-1024: dp >= 4 to hold 1024 GPUs in 32 stages of tp 8, M <= 128 at gbs 512: share ~0.2)
    interleave. Any other ``asked`` is returned unchanged."""
    if asked != "default":
        return asked
    m_star = max(num_microbatches, default=0)
    depths = stage_counts(m_star, max_stages, num_layers)
    return "auto" if depths and fill_share(m_star, max(depths)) >= MATERIAL_FILL else 1


def occupying_microbatches(variants, opts, max_stages: int, total_gpus: int) -> list[int]:
    """Eq. D2's candidates for M*: the micro-batch counts of the variants whose widest pipeline (``max_stages``
    stages of their largest allowed option) can hold every GPU of the cluster; when none can, the variant(s)
    that hold the most. Why: a variant of few samples per micro-batch (many micro-batches, a small bubble) has
    small dp, so on a large cluster it leaves most GPUs idle and is never the plan; judging the bubble at its M
    kept vpp 1 where interleaving proved >= 7.8 % faster (gpt3-1.3b on hetero3-4096, search_dimensions.md)."""
    gpus = np.array([o.num_gpus for o in opts], float)
    reach = [min(total_gpus, max_stages * float(gpus[v.allowed].max(initial=0.0))) for v in variants]
    top = max(reach, default=0.0)
    return [v.num_microbatches for v, r in zip(variants, reach) if r >= top]


def vpp_candidates(asked: str | int, can_interleave: bool, why: str = "", num_layers: int | None = None
                   ) -> tuple[int, ...]:
    """The vpp values > 1 to search for ``--vpp`` (1: none; N: N; auto: AUTO_CANDIDATES where the engine
    interleaves, none elsewhere). An explicit N > 1 the engine cannot run is the user's error, and so is one no plan
    of ``num_layers`` layers can have (eq. I5: P >= 3 stages, L - P + 1 >= N, so N <= L - 2; before, such an N
    searched vpp 1 alone without a word). ("default" is resolved by ``default_vpp`` first.)"""
    if asked in (1, "1"):
        return ()
    if asked == "auto":
        return AUTO_CANDIDATES if can_interleave else ()
    try:
        n = int(asked)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise HaapInputError(f"--vpp {asked!r}: use auto or a whole number >= 1 (model chunks per pipeline stage).",
                             field="--vpp", value=asked)
    if n > 1 and not can_interleave:
        raise HaapInputError(f"--vpp {n}: {why or 'the target engine has no interleaved schedule'}; "
                             f"use --vpp 1 or another --target.", field="--vpp", value=asked)
    if n > 1 and num_layers is not None and n > num_layers - 2:
        raise HaapInputError(f"--vpp {n}: no interleaved plan of {num_layers} layers has {n} chunks per stage (it "
                             f"needs 3 stages at least and L - P + 1 >= vpp, so vpp <= {max(num_layers - 2, 1)}); "
                             "use a smaller --vpp or auto.", field="--vpp", value=asked)
    return (n,) if n > 1 else ()


def stage_counts(num_microbatches: int, max_stages: int, num_layers: int, vpp: int = 1) -> list[int]:
    """Eq. I5: the stage counts P an interleaved plan may have (P >= 3, P | M, at most max_stages and L, and
    vpp <= L - P + 1: ``parallel_rules.vpp_fills_rounds``, so some plan of the copy fills every virtual round)."""
    hi = min(max_stages, num_layers, num_microbatches)
    return [p for p in range(MIN_STAGES, hi + 1) if num_microbatches % p == 0 and vpp_fills_rounds(num_layers, p, vpp)]


def interleaved_variants(variants, vpps: tuple[int, ...], max_stages: int, num_layers: int,
                         min_fill: float = 0.0) -> list:
    """One copy of each plain variant per (vpp, P) of eq. I5, in that order (the plain variants are kept
    first by the caller, so vpp = 1 plans keep their indices). ``min_fill`` > 0 (eq. D2, the default) keeps
    only the (M, P) whose 1F1B fill/drain share reaches it: a shallower pipeline would gain less than the rule's
    bound from interleaving. Each copy's LM-head activations are rescaled (``_loss_share``)."""
    out = []
    for var in variants:
        for v in vpps:
            for p in stage_counts(var.num_microbatches, max_stages, num_layers, v):
                if fill_share(var.num_microbatches, p) >= min_fill:
                    share = _loss_share(var.num_microbatches, p, v)
                    out.append(replace(var, vpp=v, num_stages=p, last_act_mem=var.last_act_mem * share))
    return out


def _loss_share(num_microbatches: int, num_stages: int, vpp: int) -> float:
    """Eq. M2 charges the last stage a_{P-1} * last_act_mem for its LM head (input and fp32 logits); the estimator
    keeps only ``loss_inflight`` micro-batches of them (one under interleaving: each micro-batch's loss chunk runs
    its backward at once). With P fixed per copy (eq. I5), a_{P-1} is a constant of the copy, so scaling
    last_act_mem by loss_inflight / a_{P-1} makes the Problem's memory row equal the estimator's (without it the
    solvers rejected interleaved plans that fit, and missed the optimum: tests/test_spec_oracle_dimensions.py)."""
    a_last = inflight("interleaved", num_stages - 1, num_stages, num_microbatches, vpp)
    return min(a_last, loss_inflight("interleaved", num_microbatches)) / a_last


def chunk_layers(num_layers: int, vpp: int) -> list[int]:
    """Layers of each of a stage's vpp chunks: as even as possible, earlier chunks taking the remainder."""
    base, extra = divmod(num_layers, vpp)
    return [base + (1 if c < extra else 0) for c in range(vpp)]
