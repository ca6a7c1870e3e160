"""Presolve's context-parallel (cp) and expert-tensor-parallel (etp) dimensions (formulations/ eqs. CP1-CP5).

* cp is one number per plan (Megatron-Core ``--context-parallel-size``, torchtitan ``context_parallel_degree``
  and FlagScale's meshes all take one cp for every rank), so it is part of the micro-batch *variant*: a variant
  is (B, cp) and only options of that cp are allowed in it (eq. CP1). The solvers already pick one variant per
  plan, so no solver changes: every solver, ``problem.evaluate``, brute force and decode see cp through the
  options' GPU usage (tp*dp*cp, eq. G1) and cost coefficients (priced by the estimator with cp: ring attention
  on the real link, activations and attention FLOPs per rank divided by cp; eqs. CP2, CP3).
* etp is per option (per stage), like ep: ep*etp folds onto the stage's tp*dp*cp ranks, etp divides the expert
  FFN and stays inside a node (eq. CP4). Options differing only in etp use the same GPUs, so presolve's
  outclassing rule compares them (sound, one block per (group, tp, dp, cp)).
* Pruning (eq. CP5, sound): a cp > 1 variant is dropped when every option allowed in it has a *twin* in the
  cp = 1 variant of the same B whose coefficients are no worse; see ``dominated_cp_variants``.

Every option here is single-group: a stage with cp, ep or etp > 1 lives in one (GPU type, island) group, so its
ring, all-to-all and expert-TP collectives never cross an island link (eq. CP6; a mixed stage has cp = ep = etp
= 1, eq. H1).
"""

from __future__ import annotations

import numpy as np

from haap_milp.errors import HaapInputError
from haap_milp.parallel_rules import cp_divides_seq, ep_fits_grid, etp_divides_ffn, etp_fits_node
from haap_milp.problem import Option

CP_CANDIDATES = (1, 2, 4, 8, 16)
ETP_CANDIDATES = (1, 2, 4, 8)
#: Variant coefficient arrays that must be no worse in the twin for eq. CP5 (per option).
_KEYS = ("layer_time", "first_time", "last_time", "layer_static_mem", "layer_act_mem", "first_static_mem",
         "first_act_mem", "last_static_mem", "last_act_mem", "fixed_mem", "sync_fixed", "sync_per_layer",
         "sync_first", "sync_last")


LONG_CONTEXT_TOKENS = 32_768  # eq. D1: the default searches cp from this seq_len up (see default_cp)


def default_cp(asked, seq_len: int):
    """Eq. D1: ``--cp`` left unset searches cp (auto) from ``LONG_CONTEXT_TOKENS`` tokens per sequence up, and
    keeps cp 1 below. Why 32k: a layer's activations grow with s and its attention FLOPs with s^2 while its
    weights do not, so from 32k tokens activations (not weights) set the memory a stage needs and attention
    is a large share of the layer's time; cp divides both by cp per rank (eqs. CP2, CP3), and every long-context
    recipe (Megatron, torchtitan, Llama 3's 128k stage) uses it there. At 4k-8k tokens a cp ring only adds
    traffic that tp/dp/pp do without, and searching it costs solve time (benchmarks/results/
    search_dimensions.md). Any other ``asked`` (a number or auto) is returned unchanged."""
    if asked != "default":
        return asked
    return "auto" if seq_len >= LONG_CONTEXT_TOKENS else 1


def cp_candidates(asked, seq_len: int, engine_cp: bool = True,
                  why_not: str = "the target engine cannot run context parallelism; use --cp 1 or another --target"
                  ) -> list[int]:
    """Context-parallel degrees to search: ``asked`` = 1, a number N (checked: 2N divides seq_len), "auto"
    (every candidate whose 2*cp divides seq_len; only 1 where the target engine cannot run cp) or "default"
    (eq. D1: auto from 32k tokens up, else 1)."""
    asked = default_cp(asked, seq_len)
    if asked == "auto":
        return [c for c in CP_CANDIDATES if cp_divides_seq(seq_len, c) and (engine_cp or c == 1)]
    if not cp_divides_seq(seq_len, asked):
        raise HaapInputError(f"--cp {asked}: context parallelism splits each sequence into 2*cp = {2 * asked} "
                             f"chunks (load-balanced causal ring attention), so 2*cp must divide --seq {seq_len}; "
                             "pick a cp with seq % (2*cp) == 0 or --cp auto.", field="--cp", value=asked)
    if asked > 1 and not engine_cp:
        raise HaapInputError(f"--cp {asked}: {why_not}.", field="--cp", value=asked)
    return [asked]


def etp_candidates(asked, model, tp: int, dp: int, cp: int, ep: int, gpus_per_node: int,
                   engine_etp: bool = True) -> list[int]:
    """Expert-tensor-parallel degrees of an MoE option (dense: [1]): etp divides the expert FFN, fits a node and
    ep*etp folds onto tp*dp*cp (eq. CP4). A fixed ``asked`` that does not fit this option yields []."""
    if not model.is_moe:
        return [1]
    pool = ETP_CANDIDATES if asked == "auto" else (asked,)
    return [e for e in pool if (engine_etp or e == 1) and etp_divides_ffn(model.expert_ffn, e)
            and etp_fits_node(e, gpus_per_node) and ep_fits_grid(tp, dp, cp, ep, e)]


def check_etp(asked, model, engine_etp: bool = True) -> None:
    """A fixed --etp must make sense for the model and the engine (one paragraph, exit 2)."""
    if asked == "auto" or asked == 1:
        return
    if not model.is_moe:
        raise HaapInputError(f"--etp {asked}: expert tensor parallelism needs an MoE model; {model.name} is dense. "
                             "Use --etp 1.", field="--etp", value=asked)
    if not etp_divides_ffn(model.expert_ffn, asked):
        raise HaapInputError(f"--etp {asked} does not divide the expert FFN width {model.expert_ffn} of "
                             f"{model.name}; use a divisor or --etp auto.", field="--etp", value=asked)
    if not engine_etp:
        raise HaapInputError(f"--etp {asked}: the target engine cannot run expert tensor parallelism; use --etp 1 "
                             "or another --target.", field="--etp", value=asked)


def twin(o: Option) -> Option:
    """Eq. CP5's twin of a cp = c option of per-replica micro-batch m (c divides m): the same GPUs as c times
    more replicas of m / c sequences each at cp = 1 (same group, tp, ep, etp, recompute)."""
    return Option(group=o.group, tp=o.tp, dp=o.dp * o.cp, ep=o.ep, recompute=o.recompute, uniform_dims=o.uniform_dims,
                  etp=o.etp)


def dominated_cp_variants(opts: list[Option], keys: list[tuple], variants: list) -> set[int]:
    """Eq. CP5: indices of cp > 1 variants to drop. ``keys[v]`` = (B, dp or None, cp) of ``variants[v]``.

    Variant V = (B, c > 1) is dropped when every option X allowed in V has per-replica micro-batch m divisible by
    c and its twin Y (``twin``) is priced in the cp = 1 variant W of the same B (and, under eq. Q1, dp*c), fits
    one layer there, and has every time, memory and sync coefficient no larger than X's, W's boundary table no
    larger than V's. Then any plan of V maps stage by stage onto a plan of W with the same stages, layers, GPUs
    (tp*dp*c = tp*(dp*c)), budget weights (eq. W1 weights depend on an option's GPUs) and M, and T (eq. T1),
    memory (eq. M2) are monotone in every coefficient, so W holds a plan at least as good: dropping V is sound.
    Under a uniform engine every stage maps the same way, so eq. U1 still holds (same_tp_first_last: tp kept)."""
    index = {o: i for i, o in enumerate(opts)}
    by_key = {k: v for v, k in enumerate(keys)}
    out = set()
    for v, (b, dp, c) in enumerate(keys):
        if c == 1:
            continue
        w = by_key.get((b, None if dp is None else dp * c, 1))
        if w is None:
            continue
        V, W = variants[v], variants[w]
        if V.p2p_time.shape != W.p2p_time.shape or (W.p2p_time > V.p2p_time).any():
            continue
        if all(_twin_no_worse(opts, index, V, W, x, b) for x in np.flatnonzero(V.allowed).tolist()):
            out.add(v)
    return out


def _twin_no_worse(opts, index, V, W, x: int, b: int) -> bool:
    o = opts[x]
    if o.mix or (b // o.dp) % o.cp:
        return False
    y = index.get(twin(o))
    if y is None or W.mem_capacity[y] <= 0 or W.mem_capacity[y] != V.mem_capacity[x]:
        return False
    if W.fixed_mem[y] + W.layer_static_mem[y] + W.layer_act_mem[y] > W.mem_capacity[y]:
        return False  # the twin does not hold one layer: not a plan of W
    return all(getattr(W, k)[y] <= getattr(V, k)[x] for k in _KEYS)
