"""Explanations: what binds a plan, and why a problem has none.

All numbers come from the presolved problem (the estimator's prices) so the explanation agrees
with what the solvers saw.
"""

from __future__ import annotations

import math

import numpy as np

from haap_milp.estimator.override import FALLBACK_FLAG, coverage, may_price
from haap_milp.memory_cover import layers_per_gpu
from haap_milp.parallel_rules import tp_allowed
from haap_milp.pipeline import (
    END_SEND_SHARE,
    GIB,
    TIME_RTOL,
    binding_window,
    interleaved_period,
    interleaved_window_means,
    send_shares,
    steady_period,
)
from haap_milp.presolve import replica_micro_batches
from haap_milp.problem import Assignment, Problem, boundary_times, stage_memory, stage_times, sync_times, wrap_time


def _layers_per_gpu(problem: Problem) -> dict[int, tuple[float, int]]:
    """Per group: the best (layers held per GPU, option) over every variant (eq. M4's r_g)."""
    best: dict[int, tuple[float, int]] = {}
    for v in problem.variants:
        for g, (ratio, i) in layers_per_gpu(problem.options, v).items():
            if ratio > best.get(g, (-1.0, -1))[0]:
                best[g] = (ratio, i)
    return best


def _memory_reason(pre, training, model, holdable: float, best: dict) -> str:
    """Eq. M4 binds: how many layers fit, and how many GPUs of the roomiest type would make up the rest."""
    g = max(best, key=lambda k: best[k][0])
    need = math.ceil((model.num_layers - holdable) / best[g][0]) if best[g][0] > 0 else None
    gpn = pre.groups[g].gpus_per_node
    need = -(-need // gpn) * gpn if need else need  # whole nodes
    more = f"about {need} more {pre.groups[g].gpu_type} GPUs ({need // gpn} node(s))" if need else \
        "GPUs with more memory"
    return (f"memory binds: even with the most memory-frugal options the cluster's GPUs hold about "
            f"{holdable:.0f} of the {model.num_layers} layers (weights, gradients, optimizer state and "
            f"activations, embedding and LM head); it needs {more}" + _cheaper(training))


def _extras_in_layers(problem: Problem, best: dict) -> float:
    """Embedding + LM head memory, in layers of the roomiest option (they must sit somewhere): an estimate for
    the message, not eq. M4's floor (presolve drops only what that floor proves empty)."""
    if not best:
        return 0.0
    i = best[max(best, key=lambda g: best[g][0])][1]
    v = next(v for v in problem.variants if v.allowed[i])
    per_layer = v.layer_static_mem[i] + v.layer_act_mem[i]
    extra = v.first_static_mem[i] + v.first_act_mem[i] + v.last_static_mem[i] + v.last_act_mem[i]
    return float(extra / per_layer) if per_layer > 0 else 0.0


def _cheaper(training) -> str:
    alt = ", or a shorter sequence"
    return alt if training.distributed_optimizer else alt + " or --distributed-optimizer"


def infeasibility_reason(ctx) -> str:
    """One or two sentences naming the binding limit and a cheap change that would help."""
    pre, training, model = ctx.presolved, ctx.training, ctx.model
    if not pre.groups:
        return ("no GPU type of the cluster supports precision " + training.precision + " ("
                + "; ".join(pre.dropped) + "); try --precision fp16")
    problem = pre.problem
    if not problem.variants:
        if pre.memory_short is not None:  # every variant failed eq. M4 in presolve
            holdable, best, _extras = pre.memory_short
            return _memory_reason(pre, training, model, holdable, best)
        return _one_layer_reason(ctx)
    best = _layers_per_gpu(problem)
    holdable = sum(best[g][0] * problem.group_capacity[g] for g in best) - _extras_in_layers(problem, best)
    if holdable < model.num_layers:
        return _memory_reason(pre, training, model, holdable, best)
    if problem.uniform:
        asked = ctx.training.uniform
        if asked:  # the user's --uniform, not the target, made the stages equal
            return (f"no plan with the same {', '.join(asked)} on every stage fits (--uniform "
                    f"{','.join(asked)}); try fewer --uniform dimensions")
        return ("no plan with the same tp, dp, recompute and ep on every stage fits (the target engine needs "
                "uniform parallelism); try --target flagscale or --target any")
    return (f"no plan fits within {problem.max_stages} pipeline stages and the GPUs per group "
            f"({dict(zip(problem.groups, problem.group_capacity))}); try --max-stages or more GPUs")


def _priced_micro_batch(ctx, gpu: str, tp: int) -> tuple[int | None, str]:
    """The least per-replica micro-batch presolve would price at (gpu, tp), or None with the profile's coverage
    status of the least one (``estimator.override.coverage``: a profile's fallback leaves points out, and the
    estimator refuses to price them)."""
    mbs = replica_micro_batches(ctx.training)
    profile = ctx.estimator.profile
    statuses = [coverage(profile, gpu, tp, m) for m in mbs]
    m = next((m for m, st in zip(mbs, statuses) if may_price(st, profile.fallback if profile else "none")), None)
    return m, "" if m is not None else statuses[0]


def _one_layer_reason(ctx) -> str:
    """No option holds even one decoder layer: quote the smallest footprint found among the points that may be
    priced (with a profile, the ones its fallback keeps, as in presolve)."""
    est, model = ctx.estimator, ctx.model
    best, refused = None, set()
    for g in ctx.presolved.groups:
        for tp in (8, 4, 2, 1):
            if not tp_allowed(model.num_heads, model.kv_heads, tp, g.gpus_per_node):
                continue
            m, status = _priced_micro_batch(ctx, g.gpu_type, tp)
            if m is None:
                refused.add(status)
                continue
            dp = max(1, min(g.capacity // tp, ctx.training.global_batch_size // m))  # one micro-batch of dp x m
            lc = est.layer_cost(g.gpu_type, tp, dp, 1, 1, "full", dp * m)
            need = (lc.static_bytes + lc.act_bytes + est.stage_fixed_bytes(g.gpu_type, tp)) / GIB
            cap = est.usable_memory_bytes(g.gpu_type) / GIB
            if best is None or need - cap < best[0] - best[1]:
                best = (need, cap, g.gpu_type, tp, m)
            break
    if best is None:
        return _nothing_priced(ctx, refused)
    need, cap, gpu, tp, m = best
    at = f"tp={tp}" + (f" and micro-batch {m}" if m > 1 else "")
    measured = " (measured in the profile)" if coverage(est.profile, gpu, tp, m) == "measured" else ""
    return (f"memory binds: one decoder layer needs {need:.1f} GiB per GPU{measured} even at {at} with full "
            f"recompute on {gpu}, which has {cap:.1f} GiB usable; use GPUs with more memory, a shorter sequence or "
            f"larger tp")


def _nothing_priced(ctx, refused: set[str]) -> str:
    """No (tp, micro-batch) point may be priced: why (``refused``: the profile's coverage statuses of the points)."""
    if refused == {"oom"}:
        return ("memory binds: the profile measured every point it holds for the cluster's GPUs out of memory "
                "(listed under excluded); use GPUs with more memory or a shorter sequence")
    if refused:
        return (f"no option can be priced: the profile does not cover the points the search needs under "
                f"{FALLBACK_FLAG} {ctx.estimator.profile.fallback} (listed under excluded); measure them, or "
                f"use {FALLBACK_FLAG} analytic")
    return "no option is available (tp must divide heads and fit a node)"


def bottleneck(problem: Problem, a: Assignment, group_labels: tuple[str, ...]) -> str:
    """Which stage or link sets the steady-state pace, and what binds it."""
    t, c, s = stage_times(problem, a), boundary_times(problem, a), sync_times(problem, a)
    mem = stage_memory(problem, a)
    var = problem.variants[a.variant]
    j = int(np.argmax(t))
    o = problem.options[a.stages[j].option]
    where = " + ".join(f"{r.count} x {group_labels[r.group]} tp{r.tp} at {r.samples} samples" for r in o.mix) \
        if o.mix else group_labels[o.group]  # a mixed stage: its replica types (eq. H1)
    parts = [(f"stage {j} ({where}) is the slowest at {t[j] * 1e3:.1f} ms per micro-batch")]
    if var.vpp > 1:  # eqs. I1-I3: links carry vpp crossings; the round trips of eq. I3; the windows of eq. I7
        cw = wrap_time(problem, a)
        tau = interleaved_period(t, c, var.num_microbatches, var.vpp, cw)
        win, lo, hi = max(interleaved_window_means(t, c, var.num_microbatches, var.vpp, cw), default=(0.0, -1, -1))
        if tau > t[j] * (1 + 1e-6) and win >= tau * (1 - 1e-9):
            span = f"stages {lo}-{hi}" if lo < hi else f"stages {lo}-{len(t) - 1} and 0-{hi} (through the wrap)"
            parts.append(f"{span} and the links between them, each crossed {var.vpp} times per micro-batch (an "
                         f"interleaved 1F1B cycle), stretch the period to {tau * 1e3:.1f} ms (eq. I7)")
        elif tau > t[j] * (1 + 1e-6):
            parts.append(f"with {var.vpp} interleaved chunks per stage, the links ({var.vpp} crossings per "
                         f"micro-batch) and the chunks' round trips stretch the period to {tau * 1e3:.1f} ms "
                         f"(eqs. I2, I3)")
    else:
        tau = steady_period(t, c, var.num_microbatches, blocking=problem.p2p_blocking)
    if var.vpp > 1:
        pass  # said above
    elif c and max(c) / 2 >= tau * (1 - TIME_RTOL) and max(c) / 2 > t[j]:  # the link term of eq. T2 binds
        k = int(np.argmax(c))
        parts = [(f"the link between stages {k} and {k + 1} ({c[k] * 1e3:.1f} ms per micro-batch, both "
                  f"directions) is slower than every stage")]
    elif tau > t[j] * (1 + 1e-6) and tau > steady_period(t, c, var.num_microbatches) * (1 + 1e-9):
        edge = [0.0, *c, 0.0]
        p = len(t)
        share = send_shares(p)
        k = max(range(p), key=lambda i: t[i] + share[i] * (edge[i] + edge[i + 1]))
        what = "its boundary's round trip" if share[k] == END_SEND_SHARE else "one way of each boundary"
        parts.append(f"stage {k}'s blocking sends ({what}, {share[k] * (edge[k] + edge[k + 1]) * 1e3:.1f} ms) "
                     f"stretch the period to {tau * 1e3:.1f} ms (eq. T2b)")
    elif tau > t[j] * (1 + 1e-6):
        _, lo, hi = binding_window(t, c, var.num_microbatches)
        what = "the 1F1B round trip through later stages and links" if hi == len(t) - 1 else \
            f"stages {lo}-{hi} and the links between them (a 1F1B cycle of {hi - lo + 1} micro-batches)"
        parts.append(f"{what} stretch{'es' if hi == len(t) - 1 else ''} the period to {tau * 1e3:.1f} ms (eq. T2)")
    o = a.stages[j].option
    fill = mem[j] / var.mem_capacity[o]
    if fill > 0.9:
        parts.append(f"its memory is {fill:.0%} full, so it cannot take a lower recompute or more layers")
    used = [0] * len(problem.groups)
    for st in a.stages:
        for g, n in problem.options[st.option].usage:  # eq. G1
            used[g] += n
    full = [problem.groups[g] for g, u in enumerate(used) if u == problem.group_capacity[g]]
    if full:
        parts.append("all GPUs of " + ", ".join(full) + " are in use")
    idle = [f"{problem.groups[g]} ({problem.group_capacity[g] - u} idle)" for g, u in enumerate(used)
            if u < problem.group_capacity[g]]
    if idle:
        parts.append("unused: " + ", ".join(idle))
    if max(s) > 0.1 * var.num_microbatches * max(t):
        parts.append(f"DP sync is large ({max(s) * 1e3:.0f} ms)")
    return "; ".join(parts)


def estimate_bottleneck(pe, plan=None) -> str:
    """What binds a scored plan (estimator.PlanEstimate): the pacing stage, its largest time share,
    memory pressure and communication that is not hidden. ``plan`` (optional) names a mixed stage's replicas."""
    stages = pe.stages
    j = max(range(len(stages)), key=lambda i: stages[i].time_s)
    s = stages[j]
    b = s.breakdown
    st = plan.stages[j] if plan is not None and j < plan.pp else None
    where = " + ".join(f"{r.count} {r.gpu_type} tp{r.tp} x {r.micro_batch} samples" for r in st.replicas) \
        if st is not None and st.replicas else s.gpu_type
    parts = [(f"stage {j} ({where}, {s.num_layers} layers) paces the pipeline at {s.time_s * 1e3:.1f} ms "
              f"per micro-batch")]
    comm = b["tp_comm_s"] + b["ep_comm_s"] + b["cp_comm_s"]
    if comm > 0.15 * b["compute_s"]:
        parts.append(f"exposed TP/EP/CP communication is {comm / max(b['compute_s'], 1e-12):.0%} of its compute")
    fullest = max(stages, key=lambda x: x.memory_gib / x.capacity_gib)
    fill = fullest.memory_gib / fullest.capacity_gib
    if fill > 0.9:
        parts.append(f"stage {fullest.index} memory is {fill:.0%} of usable")
    bubble = max(x.breakdown["bubble_s"] for x in stages) / pe.iteration_time_s
    if bubble > 0.15:
        parts.append(f"pipeline bubble up to {bubble:.0%} of the iteration (more micro-batches or fewer stages)")
    sync = max(x.breakdown["sync_s"] for x in stages) / pe.iteration_time_s
    if sync > 0.05:
        parts.append(f"exposed DP sync {sync:.0%} of the iteration")
    return "; ".join(parts)
