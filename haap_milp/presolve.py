"""Memory-aware presolve: specs + estimator -> plain ``Problem``; solver answer -> ``Plan``.

Steps (docs/DESIGN.md step 3, AutoHAAP's memory-aware initialisation):
1. GPU groups = distinct (GPU type, island) pairs; a type without the training precision is
   dropped with a stated reason.
2. Micro-batch variants: ``B`` samples per micro-batch (every stage sees B, FlagScale
   convention), ``M = gbs / B``. Candidates are divisors of gbs; each gets the lower bound
   of eq. B1, and the planner drops those whose bound exceeds the DP plan (sound pruning).
3. Options per group: tp (divides heads and kv heads, <= GPUs per node) x per-replica
   micro-batch m (so dp = B / m) x recompute x ep (MoE). An option that cannot hold one
   layer at the cheapest pipeline position, or whose dp*tp exceeds the group, is dropped.
   Options *outclassed* by another of the same group, tp and dp (no slower, no more memory or
   sync) are dropped too (``_drop_outclassed``; not the time-dominance of eq. D1, which the slot
   tables use to bound layer counts and which drops nothing).
   With a measured profile, an option whose (GPU type, tp, per-replica micro-batch) the profile does not
   cover leaves the search under the profile's fallback policy (estimator.override.coverage).
4. Costs come from the estimator (cached per key: "state caching").
Nothing is dropped silently: ``Presolved.excluded`` names every GPU group and profile point left out,
the reason and the flag that would include it (``solve`` prints it; ``solve --json`` writes it).
The lower bound is the load-balanced compute bound of eq. B1 (formulations/README.md).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from haap_milp import cp_etp, interleave, memory_cover, mixed_stages, zero
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator
from haap_milp.estimator.override import FALLBACK_FLAG, WHY, coverage, may_price
from haap_milp.parallel_rules import ep_divides_experts, ep_fits_grid, tp_allowed
from haap_milp.pipeline import GIB, interleaved_tau_weight
from haap_milp.problem import Assignment, Option, Problem, Variant, stage_memory, stage_times
from haap_milp.specs import ClusterSpec, ModelSpec, Plan, Replica, SolveOptions, StagePlan, TrainingSpec
from haap_milp.targets import capabilities
from haap_milp.worker import fork_map

log = logging.getLogger(__name__)

TP_CANDIDATES = (1, 2, 4, 8, 16)
PER_REPLICA_MBS = (1, 2, 4, 8)  # sequences per replica per micro-batch (Megatron's --micro-batch-size)


def replica_micro_batches(training: TrainingSpec) -> tuple[int, ...]:
    """The per-replica micro-batches presolve prices: the fixed one (``--mbs``), else PER_REPLICA_MBS."""
    return (training.micro_batch_size,) if training.micro_batch_size else PER_REPLICA_MBS
DEFAULT_MAX_STAGES = 32


@dataclass(frozen=True)
class Group:
    gpu_type: str
    island: str
    capacity: int  # GPUs
    gpus_per_node: int

    @property
    def label(self) -> str:
        return f"{self.gpu_type}@{self.island}"


@dataclass(frozen=True)
class Excluded:
    """GPUs or profile points left out of the search, why, and the flag that would include them.

    ``scope`` "gpus": the whole group is left out; "points": the group's options at ``points``
    ((tp, per-replica micro-batch, why)) are left out (or, with ``priced`` "analytic", priced by the
    analytic model under --profile-fallback analytic and kept)."""

    gpu_type: str
    island: str
    gpus: int
    scope: str
    reason: str
    include_with: str | None  # the flag that would include them; None: no flag would
    points: tuple[tuple[int, int | float, str], ...] = ()
    priced: str = ""

    @property
    def label(self) -> str:
        return f"{self.gpu_type}@{self.island}"

    def as_dict(self) -> dict:
        d = {"gpu_type": self.gpu_type, "island": self.island, "gpus": self.gpus, "scope": self.scope,
             "reason": self.reason, "include_with": self.include_with}
        if self.points:
            d["points"] = [{"tp": t, "micro_batch": m, "why": w} for t, m, w in self.points]
        if self.priced:
            d["priced"] = self.priced
        return d

    def __str__(self) -> str:
        pts = ", ".join(f"tp {t} mbs {m:g} ({w})" for t, m, w in self.points)
        what = f"{self.label} ({self.gpus} GPUs)" + (f" at {pts}" if pts else "")
        if self.priced:
            return f"{what}: {self.reason}"
        return f"{what}: {self.reason}; " + (f"include with {self.include_with}" if self.include_with else
                                            "no flag would include them")


@dataclass
class Presolved:
    """The problem plus what is needed to decode and explain it."""

    problem: Problem
    groups: tuple[Group, ...]
    lower_bounds_s: dict[int, float]  # variant -> eq. B1 bound
    dropped: list[str] = field(default_factory=list)  # human-readable reasons (groups, variants)
    stats: dict = field(default_factory=dict)
    excluded: list[Excluded] = field(default_factory=list)  # GPUs and profile points left out (never silently)
    analytic: list[Excluded] = field(default_factory=list)  # profile points priced by the fallback (kept)
    profile: dict | None = None  # which GPU types the profile prices (profile_summary)
    memory_short: tuple | None = None  # eq. M4: (cover, layers per GPU, extras) of the roomiest dropped variant

    @property
    def lower_bound_s(self) -> float | None:
        return min(self.lower_bounds_s.values()) if self.lower_bounds_s else None


def cluster_groups(cluster: ClusterSpec) -> list[Group]:
    """Distinct (GPU type, island) pairs, in cluster order."""
    caps: dict[tuple[str, str], list[int]] = {}
    for ng in cluster.node_groups:
        c = caps.setdefault((ng.gpu.name, ng.island), [0, ng.gpus_per_node])
        c[0] += ng.num_gpus
        c[1] = min(c[1], ng.gpus_per_node)
    return [Group(t, i, cap, gpn) for (t, i), (cap, gpn) in caps.items()]


def tp_candidates(model: ModelSpec, gpus_per_node: int) -> list[int]:
    """tp must divide heads and kv heads (Megatron: num_query_groups % tp == 0) and fit a node."""
    return [t for t in TP_CANDIDATES if tp_allowed(model.num_heads, model.kv_heads, t, gpus_per_node)]


def ep_candidates(model: ModelSpec, tp: int, dp: int, cp: int = 1) -> list[int]:
    """Expert parallel degrees: divide the experts and the tp*dp*cp ranks of the stage (etp: cp_etp.py)."""
    if not model.is_moe:
        return [1]
    return [e for e in (1, 2, 4, 8, 16, 32, 64) if ep_divides_experts(model.num_experts, e) and ep_fits_grid(tp, dp, cp, e)]


def microbatch_candidates(training: TrainingSpec, total_gpus: int, options: SolveOptions) -> list[int]:
    """Samples per micro-batch B: user list, else divisors of gbs with M = gbs/B >= 1 and B <= 8 per GPU."""
    gbs = training.global_batch_size
    if options.micro_batch_sizes:
        return sorted({b for b in options.micro_batch_sizes if gbs % b == 0})
    return divisors(gbs, 8 * total_gpus)


def divisors(n: int, at_most: int) -> list[int]:
    """The divisors of n that are <= at_most, ascending, in O(sqrt(n)) steps: each pair (d, n / d) is found
    from its smaller member (trial division by every number up to n took 3.5 s at --gbs 1e8)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    both = sorted(set(small) | {n // d for d in small})
    return [d for d in both if d <= at_most]


def uniform_dims(training: TrainingSpec, target_uniform: bool) -> tuple[str, ...]:
    """Dimensions eq. U1 makes equal: the runtime's ``uniform`` (mbs = B/dp is equal exactly when dp is, B
    being common to all stages), all of (tp, dp, recompute, ep) under a uniform target; () when none."""
    if target_uniform:
        return ("tp", "dp", "recompute", "ep", "etp")
    asked = {"dp" if d == "mbs" else d for d in training.uniform}
    return tuple(d for d in ("tp", "dp", "recompute", "ep") if d in asked)


def build(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    options: SolveOptions,
    estimator: Estimator | None = None,
    target_uniform: bool | None = None,
) -> Presolved:
    """Enumerate, price and prune; return the solver-facing problem (eq. labels: formulations/)."""
    t0 = time.perf_counter()
    est = estimator or Estimator(model, cluster, training)
    dropped: list[str] = []
    groups = []
    excluded: list[Excluded] = []
    for g in cluster_groups(cluster):
        if cluster.gpu(g.gpu_type).peak_tflops(training.precision) is None:
            dropped.append(f"{g.label} ({g.capacity} GPUs): no {training.precision} support")
            excluded.append(_precision_excluded(cluster, g, training.precision))
        else:
            groups.append(g)
    profile = est.profile
    left_out: dict[int, dict[tuple[int, int], str]] = {}  # group -> (tp, mbs) -> coverage status
    fallback_priced: dict[int, dict[tuple[int, int], str]] = {}
    caps = capabilities(options.target)  # what the target engine can run (haap_milp.targets)
    uniform = caps.uniform_stages if target_uniform is None else target_uniform
    same_tp = caps.same_tp_first_last_when_tied and model.tied_embeddings
    total = sum(g.capacity for g in groups)
    modes = tuple(m for m in options.recompute if m in training.recompute_modes)  # the runtime's allowed set
    if caps.selective_runs_as:  # torchtitan: the selective checkpointing it runs is op-level SAC (haap's "op")
        modes = tuple(dict.fromkeys(caps.selective_runs_as if m == "selective" else m for m in modes))
    dims = uniform_dims(training, uniform)
    uniform = uniform or bool(dims)
    dims = dims or ("tp", "dp", "recompute")
    if caps.recompute_modes is not None:  # e.g. FlagScale cannot mix selective with other per-stage modes
        runnable = tuple(m for m in modes if m in caps.recompute_modes)
        if modes and not runnable:  # (searching them anyway only ends in the checker's refusal after the solve)
            raise HaapInputError(f"--recompute {','.join(modes)}: target {caps.name} runs none of these "
                                 f"modes (it runs {', '.join(caps.recompute_modes)}); ask for one of those or "
                                 f"choose another --target.")
        modes = runnable
    single = options.max_stages == 1 or (caps.max_stages_when_tied == 1 and model.tied_embeddings)
    zeros = zero.search_set(options.zero, training, caps, single)  # eq. Z1; (None,): the runtime's, not searched
    if (caps.uniform_stages if target_uniform is None else target_uniform) and zeros != (None,):
        dims = (*dims, "zero")  # a uniform engine runs one ZeRO stage (one optimizer / one device mesh)
    mixed = mixed_enabled(options.mixed_stages, caps, caps.uniform_stages if target_uniform is None else target_uniform,
                          training.uniform)
    pairs = mixed_stages.island_pairs(groups) if mixed else []
    pair_index = {pr: len(groups) + i for i, pr in enumerate(pairs)}  # eq. H5: one p2p endpoint per pair
    # eq. CP1: one cp per variant; DeepSpeed's PipelineEngine (blocking sends) has no context parallelism, and
    # eq. Q2's per-replica sends are priced for whole sequences
    cps = cp_etp.cp_candidates(options.cp, training.seq_len, caps.context_parallel and not est.p2p_blocking,
                               "DeepSpeed's PipelineEngine (--engine deepspeed) has no context parallelism; use "
                               "--cp 1 or another --engine" if est.p2p_blocking else
                               f"target {caps.name} cannot run context parallelism; use --cp 1 or another --target")
    cp_etp.check_etp(options.etp, model, caps.expert_tensor_parallel)
    n_before = 0
    opts: list[Option] = []
    opt_index: dict[Option, int] = {}
    variant_opts: dict[int, list[int]] = {}
    batches = microbatch_candidates(training, max(total, 1), options)
    mixed_of = _mixed_options(est, model, training, groups, batches if 1 in cps else [], modes, dims, pairs,
                              pair_index, options.threads)
    # cp outer: the cp 1 variants come first, in the order of the search without cp, so a heuristic cut short by
    # the deadline (the DP walks variants in order) has covered at least that search
    for cp, b in ((cp, b) for cp in cps for b in batches):
        allowed = []
        for gi, g in enumerate(groups):
            for tp in tp_candidates(model, g.gpus_per_node):
                for m in replica_micro_batches(training):
                    if b % m or tp * (b // m) * cp > g.capacity:
                        continue
                    if profile is not None:
                        status = coverage(profile, g.gpu_type, tp, m)
                        if not may_price(status, profile.fallback):
                            left_out.setdefault(gi, {})[(tp, m)] = status
                            continue
                        if status in ("interpolated", "missing"):
                            fallback_priced.setdefault(gi, {})[(tp, m)] = status
                    dp = b // m
                    for ep, etp in ((e, x) for e in ep_candidates(model, tp, dp, cp) for x in
                                    cp_etp.etp_candidates(options.etp, model, tp, dp, cp, e, g.gpus_per_node,
                                                          caps.expert_tensor_parallel)):
                        for rc in modes:
                            for z in zeros:
                                n_before += 1
                                o = Option(group=gi, tp=tp, dp=dp, ep=ep, recompute=rc, uniform_dims=dims, zero=z,
                                           cp=cp, etp=etp)
                                if o not in opt_index:
                                    opt_index[o] = len(opts)
                                    opts.append(o)
                                allowed.append(opt_index[o])
        if pairs and cp == 1:  # eq. H7 (a mixed stage has cp = 1)
            for o in mixed_of.get(b, ()):
                n_before += 1
                if o not in opt_index:
                    opt_index[o] = len(opts)
                    opts.append(o)
                allowed.append(opt_index[o])
        if allowed:
            variant_opts[(b, cp)] = allowed
    variants, bounds = [], {}
    ends = mixed_stages.endpoint_members(groups, pairs)
    replica_ends = None
    if est.p2p_per_replica:  # eq. Q1: one dp per variant, so the p2p table can price each replica's stream
        variant_opts = {(b, dp, cp): [i for i in ids if opts[i].dp == dp]
                        for (b, cp), ids in variant_opts.items() for dp in sorted({opts[i].dp for i in ids})}
        replica_ends = _replica_endpoints(opts, len(groups))  # eq. Q2: one endpoint per (group, tp) / mix
    else:
        variant_opts = {(b, None, cp): ids for (b, cp), ids in variant_opts.items()}
    priced = dict(zip(variant_opts, fork_map(  # (eq. PAR5)
        lambda item: _price_variant(est, model, training, groups, opts, item[0][0], item[1], uniform, ends, item[0][1],
                                    item[0][2], replica_ends), list(variant_opts.items()), options.threads)))
    held = [k for k, (var, _lb) in priced.items() if var.allowed.any()]
    cp_dominated = {held[v] for v in cp_etp.dominated_cp_variants(opts, held, [priced[k][0] for k in held])}
    short, too_small = None, []  # eq. M4: (cover, layers per GPU, extras) of the roomiest variant it drops
    for (b, _dp, cp), (var, lb) in priced.items():
        name = f"B={b} samples per micro-batch" + (f", dp {_dp}" if _dp else "") + (f", cp {cp}" if cp > 1 else "")
        if (b, _dp, cp) in cp_dominated:
            dropped.append(f"{name}: every option has a no-worse cp 1 twin (eq. CP5)")
        elif not var.allowed.any():
            dropped.append(f"{name}: no option holds one layer")
        elif (held_layers := memory_cover.cover(opts, [g.capacity for g in groups], var)) < model.num_layers:
            dropped.append(f"{name}: the cluster's memory holds at most {held_layers:.0f} of the "
                           f"{model.num_layers} layers (eq. M4)")
            too_small.append(var)
            if short is None or held_layers > short[0]:
                short = (held_layers, memory_cover.layers_per_gpu(opts, var), memory_cover.extras_layers(var))
        else:
            bounds[len(variants)] = lb
            variants.append(var)
    max_stages = _max_stages(model, groups, options, variants, opts)
    if caps.max_stages_when_tied is not None and model.tied_embeddings:
        max_stages = min(max_stages, caps.max_stages_when_tied)  # e.g. torchtitan cannot tie first and last stage
    vpp_asked = interleave.default_vpp(options.vpp, interleave.occupying_microbatches(
        variants, opts, max_stages, sum(g.capacity for g in groups)), max_stages, model.num_layers)  # eq. D2
    vpps = interleave.vpp_candidates(vpp_asked, caps.interleave and not est.p2p_blocking,
                                     "DeepSpeed's PipelineEngine has no interleaved schedule" if est.p2p_blocking
                                     else f"target {caps.name} has no interleaved schedule", model.num_layers)
    min_fill = interleave.MATERIAL_FILL if options.vpp == "default" else 0.0
    for var in interleave.interleaved_variants(list(variants), vpps, max_stages, model.num_layers,
                                               min_fill):  # eqs. I5, D2
        bounds[len(variants)] = compute_bound(opts, groups, var, model.num_layers)
        variants.append(var)
    problem = Problem(
        num_layers=model.num_layers,
        max_stages=max_stages,
        groups=tuple(g.label for g in groups),
        group_capacity=tuple(g.capacity for g in groups),
        options=tuple(opts),
        variants=tuple(variants),
        uniform=uniform,
        same_tp_first_last=same_tp,
        p2p_blocking=est.p2p_blocking,
    )
    kept = sum(int(v.allowed.sum()) for v in variants)
    stats = {
        "options_enumerated": n_before,
        "options_kept": kept,
        "variants_considered": len(priced),
        "variants_kept": len(variants),
        "max_stages": max_stages,
        "cp_variants_dominated": len(cp_dominated),
        "mixed_options": sum(int(v.allowed[i]) for v in variants for i in range(len(opts)) if opts[i].mix),
        "presolve_s": round(time.perf_counter() - t0, 4),
    }
    stats.update({f"cache_{k}": v for k, v in est.cache_stats().items() if isinstance(v, (int, float))})
    used = {opts[i].group for v in variants + too_small for i in np.flatnonzero(v.allowed)}  # M4: not "unused"
    excluded += _profile_points(groups, left_out, profile, "points")
    for gi, g in enumerate(groups):
        if gi not in used:
            excluded.append(_group_unused(est, g, gi, opts, left_out, priced))
    analytic = _profile_points(groups, fallback_priced, profile, "analytic")
    if analytic:
        log.info("priced without a measurement (--profile-fallback %s): %s", profile.fallback,
                 "; ".join(map(str, analytic)))  # the CLI warns on stderr; the API reads Presolved.analytic
    summary = profile_summary(profile, groups) if profile is not None else None
    return Presolved(problem, tuple(groups), bounds, dropped, stats, excluded, analytic, summary, short)


def _mixed_options(est, model, training, groups, batches, modes, dims, pairs, pair_index, threads: int) -> dict:
    """Eq. H7 per micro-batch (a mixed stage has cp = 1): {b: its mixed options, in ``pairs``' order}, on two processes
    (eq. PAR5) by shares of the pairs (``mixed_stages.pair_batches``) that read disjoint layer prices where there are
    two islands (measured: 1.3 of 1.6 s of presolve on llama3-70b x 256 GPUs x 3 types x 2 islands in one process),
    a pair and its twin on an island that prices one replica alike in one share (``Estimator.replica_island``)."""
    shares = mixed_stages.pair_batches(groups, pairs, lambda g: (groups[g].gpu_type,
                                                                 est.replica_island(groups[g].gpu_type, groups[g].island)))
    work = [(b, share) for b in batches for share in shares]  # (fork_map's halves: alternate shares of each b)
    memo: dict = {}  # (layer times read by the pairs; each process fills its own copy)
    got = fork_map(lambda w: {pr: mixed_stages.pair_options(est, model, training, groups, w[0], modes, dims, pr,
                                                            pair_index[pr], memo) for pr in w[1]}, work, threads)
    per = {}
    for (b, _share), found in zip(work, got):
        per.setdefault(b, {}).update(found)
    return {b: [o for pr in pairs for o in per[b][pr]] for b in per}


def mixed_enabled(asked: str, caps, target_uniform: bool, runtime_uniform=()) -> bool:
    """Whether presolve enumerates mixed stages (eq. H7): ``--mixed-stages auto`` where the target engine can
    run them and the runtime does not need one tp or one per-replica micro-batch in every stage (``--uniform
    dp`` and ``recompute`` are fine: a mixed stage's dp is its replica count); ``on`` where they cannot run is
    the user's error."""
    if asked == "off":
        return False
    fixed = sorted({"tp", "mbs"} & set(runtime_uniform))
    why = ("the target engine cannot run a stage whose replicas differ in GPU type" if not caps.mixed_stages else
           "stages must be uniform (a uniform target)" if target_uniform else
           f"the runtime needs one {' and one '.join(fixed)} in every stage (--uniform)" if fixed else "")
    if asked == "on" and why:
        raise HaapInputError(f"--mixed-stages on: {why}; use --mixed-stages off or --target any.",
                             field="--mixed-stages", value=asked)
    return not why


def supported_precisions(gpu) -> list[str]:
    """The precisions ``gpu`` has a peak for, in the order of specs.Precision."""
    from typing import get_args

    from haap_milp.specs import Precision

    out = []
    for p in get_args(Precision):
        try:
            if gpu.peak_tflops(p) is not None:
                out.append(p)
        except (KeyError, ValueError):
            continue
    return out


def _precision_excluded(cluster: ClusterSpec, g: Group, precision: str) -> Excluded:
    have = supported_precisions(cluster.gpu(g.gpu_type))
    flag = " (or ".join(f"--precision {p}" for p in have[:2]) + (")" if len(have) > 1 else "") if have else ""
    return Excluded(g.gpu_type, g.island, g.capacity, "gpus", f"no {precision} on this GPU (it has "
                    f"{', '.join(have) or 'no supported precision'})", flag or None)


def _profile_points(groups, points: dict[int, dict[tuple[int, int], str]], profile, scope: str) -> list[Excluded]:
    """One entry per group: the profile points left out (scope "points") or priced analytically."""
    out = []
    for gi, pts in sorted(points.items()):
        g = groups[gi]
        listed = tuple((t, m, WHY[st]) for (t, m), st in sorted(pts.items()))
        if scope == "analytic":
            out.append(Excluded(g.gpu_type, g.island, g.capacity, "points", "not covered by the profile, priced by "
                                f"the {'analytic model' if profile.fallback == 'analytic' else 'interpolation'}",
                                None, listed, priced=profile.fallback))
            continue
        flags = {"oom": "", "interpolated": f"{FALLBACK_FLAG} interpolate", "missing": f"{FALLBACK_FLAG} analytic"}
        wanted = sorted({flags[st] for st in pts.values()} - {""}, reverse=True)
        oom_only = not wanted
        out.append(Excluded(g.gpu_type, g.island, g.capacity, "points", "not covered by the profile, left out of "
                            "the search" + ("; out-of-memory points are never priced" if any(
                                st == "oom" for st in pts.values()) else ""),
                            None if oom_only else wanted[-1] if len(wanted) == 1
                            else f"{FALLBACK_FLAG} analytic", listed))
    return out


def _group_unused(est, g: Group, gi: int, opts, left_out, priced) -> Excluded:
    """Why a group has no option left in any micro-batch variant."""
    needs = [(v.fixed_mem[i] + v.layer_static_mem[i] + v.layer_act_mem[i], v.mem_capacity[i],
              v.fixed_mem[i] + v.layer_static_mem[i])
             for v, _lb in priced.values() for i in range(len(opts)) if opts[i].group == gi and v.mem_capacity[i] > 0]
    if needs:
        need, cap, static = min(needs)
        physical = est.hardware(g.gpu_type).gpu.memory_gib * GIB
        flag = "--memory-headroom 0" if need <= physical else "a shorter --seq" if static <= cap else None
        return Excluded(g.gpu_type, g.island, g.capacity, "gpus", f"cannot hold one decoder layer (needs "
                        f"{need / GIB:.1f} GiB per GPU at best, {cap / GIB:.1f} GiB usable)", flag)
    if left_out.get(gi):
        return Excluded(g.gpu_type, g.island, g.capacity, "gpus", "the profile covers none of its options",
                        f"{FALLBACK_FLAG} analytic")
    return Excluded(g.gpu_type, g.island, g.capacity, "gpus", "no stage option fits its GPUs", None)


def profile_summary(profile, groups) -> dict:
    """Which GPU types of the cluster the profile prices, and how it treats the others."""
    types = profile.gpu_types()
    per = {}
    for t in dict.fromkeys(g.gpu_type for g in groups):
        pts = [k for k in profile.entries if k[0] == t]
        if t in types:
            tps = sorted({k[1] for k in pts})
            per[t] = f"measured: {len(pts)} points (tp {', '.join(map(str, tps))})"
        else:
            per[t] = (f"no profile, analytic (the profile has {', '.join(sorted(types))}; map a Metis device with "
                      "--profile-device)")
    return {"sources": profile.meta.get("sources", [profile.source]), "fallback": profile.fallback,
            "gpu_types": per}


def _option_costs(est, groups, o: Option, b: int):
    """(layer, first, last, fixed bytes, usable bytes, fixed sync s) of one option; a mixed option's from
    estimator/mixed.py (eqs. H3, H4, H6: memory normalised to the first type's capacity)."""
    if o.mix:
        mc = est.mixed_costs(mixed_stages.replica_keys(groups, o), o.ep, o.recompute)
        return mc.layer, mc.first, mc.last, mc.fixed_bytes, mc.capacity_bytes, mc.fixed_sync_s
    g = groups[o.group]
    args = (g.gpu_type, o.tp, o.dp, o.ep, o.etp, o.recompute, b)
    kw = {"island": g.island, "cp": o.cp, "zero": o.zero}  # eq. Z1: the option's ZeRO stage prices every coefficient
    lc = est.layer_cost(*args, **kw)
    fc, lastc = est.first_stage_extra(*args, **kw), est.last_stage_extra(*args, **kw)
    # full recompute adds the transient activations of the layer being recomputed
    fixed = est.stage_fixed_bytes(g.gpu_type, o.tp, dp=o.dp, recompute=o.recompute, samples_per_microbatch=b, ep=o.ep,
                                  cp=o.cp, etp=o.etp, zero=o.zero)
    return (lc, fc, lastc, fixed, est.usable_memory_bytes(g.gpu_type),
            est.stage_fixed_sync_s(g.gpu_type, g.island, o.tp, o.dp, ep=o.ep, cp=o.cp, etp=o.etp, zero=o.zero))


def _replica_endpoints(opts: list[Option], G: int) -> list[tuple[tuple[int, int, int | None], ...]]:
    """Eq. Q2: under eq. Q1 a boundary's price depends on the GPU type and tp of each replica on both sides
    (and a mixed stage's per-type samples), so every single-group option gets the endpoint of its (group, tp)
    and every mixed option the endpoint of its replica types (group, tp, samples); ``opts`` is rewritten in
    place with those endpoints (``Option.link`` = G + index). Returns the members of endpoints G.. as
    (group, tp, samples per replica or None: the variant's B / dp)."""
    keys: dict[tuple, int] = {}
    for i, o in enumerate(opts):
        key = tuple((r.group, r.tp, r.samples) for r in o.mix) if o.mix else ((o.group, o.tp, None),)
        opts[i] = replace(o, link=G + keys.setdefault(key, len(keys)))
    return list(keys)


def _replica_p2p(est, groups, members, G: int, b: int, dp: int) -> np.ndarray:
    """Eq. Q2's table [G + len(members)]^2 for micro-batch b at dp: an endpoint pair's price is its slowest
    member pair's round trip (eq. H5 over replica types; exact for single-group options), each way at the
    sender replica's samples; rows < G (no option's endpoint under eq. Q1: only the bounds read them, eq. B2)
    hold the least price of any endpoint pair on those groups, so they stay lower bounds."""
    def key(m):
        g, tp, samples = m
        return (groups[g].gpu_type, groups[g].island), tp, (b / dp if samples is None else samples)

    # each distinct replica type's round trips priced once (the endpoints share members: 5.2 M calls of one_way
    # on Sailor's analytic 32+96 row, most of its presolve, before); the same sums and maxima as pair by pair.
    # One way depends on the sender's (group, tp, samples) and the receiver's (group, tp) only: priced once per
    # such pair (Sailor's analytic 32+96 row: 6.5 k calls a variant on 57 replica types, 0.3 k now)
    kinds = sorted({x for xs in members for x in xs}, key=repr)
    at = {x: i for i, x in enumerate(kinds)}
    keys = [key(x) for x in kinds]
    snd = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    rcv = {k[:2]: i for i, k in enumerate(dict.fromkeys(k[:2] for k in keys))}
    ow = np.array([[est.replica_send_s(ga, gb, ta, tb, sa) for (gb, tb) in rcv] for (ga, ta, sa) in snd])
    s_of = np.array([snd[k] for k in keys], np.int64)
    r_of = np.array([rcv[k[:2]] for k in keys], np.int64)
    trip = (ow[s_of[:, None], r_of[None, :]] + ow[s_of[None, :], r_of[:, None]]).reshape(len(kinds), len(kinds))
    width = max((len(xs) for xs in members), default=1)
    idx = np.array([[at[x] for x in xs] + [at[xs[0]]] * (width - len(xs)) for xs in members], np.int64)  # (padded
    E = G + len(members)  # with a repeated member: the maximum does not change)
    p2p = np.full((E, E), np.inf)
    if len(members):
        p2p[G:, G:] = np.max([trip[np.ix_(idx[:, i], idx[:, j])] for i in range(width) for j in range(width)], axis=0)
    return fill_group_rows(p2p, [[G + e for e, xs in enumerate(members) if any(x[0] == g for x in xs)]
                                 for g in range(G)])


def fill_group_rows(p2p: np.ndarray, of: list[list[int]]) -> np.ndarray:
    """Eq. Q2: rows and columns g < G (``of[g]``: the endpoints holding group g) get the least price over the
    group's endpoints (0 where it has none), so that every bound reading group pairs (eq. B2's knapsack and
    link components) stays a lower bound; no option's endpoint is a group row under eq. Q2."""
    G = len(of)
    for g in range(G):
        p2p[g, G:] = p2p[of[g], G:].min(axis=0) if of[g] else 0.0
        p2p[G:, g] = p2p[G:, of[g]].min(axis=1) if of[g] else 0.0
    for g in range(G):
        for h in range(G):
            p2p[g, h] = p2p[np.ix_(of[g], of[h])].min() if of[g] and of[h] else 0.0
    return p2p


def _price_variant(est, model, training, groups, opts, b, ids, uniform: bool = False,
                   ends: list[tuple[int, ...]] | None = None, dp: int | None = None, cp: int = 1,
                   replica_ends: list | None = None) -> tuple[Variant, float]:
    """Cost arrays for one micro-batch choice and cp (eq. CP1; under eq. Q1, one dp) and its eq. B1 bound."""
    n = len(opts)
    z = lambda: np.zeros(n)
    a = {k: z() for k in ("lt", "ft", "lat", "ls", "la", "fs", "fa", "xs", "xa", "fx", "cap", "sf", "sl", "s1", "sL")}
    allowed = np.zeros(n, dtype=bool)
    m_count = training.global_batch_size // b
    for i in ids:
        o = opts[i]
        try:
            lc, fc, lastc, fixed, cap, fsync = _option_costs(est, groups, o, b)
        except HaapInputError as exc:  # a combination the estimator cannot run (e.g. precision): not an option
            log.debug("option %s dropped: %s", o, exc)
            continue
        a["lt"][i], a["ft"][i], a["lat"][i] = lc.time_s, fc.time_s, lastc.time_s
        a["ls"][i], a["la"][i] = lc.static_bytes, lc.act_bytes
        a["fs"][i], a["fa"][i] = fc.static_bytes, fc.act_bytes
        a["xs"][i], a["xa"][i] = lastc.static_bytes, lastc.act_bytes
        a["fx"][i], a["cap"][i] = fixed, cap
        a["sl"][i], a["s1"][i], a["sL"][i] = lc.sync_s, fc.sync_s, lastc.sync_s
        a["sf"][i] = fsync
        # memory-aware pruning: must hold one layer at the cheapest position (last stage, 1 micro-batch in flight)
        allowed[i] = fixed + lc.static_bytes + lc.act_bytes <= cap
    allowed = _drop_outclassed(opts, allowed, a, uniform)
    if uniform:  # eq. Z1 under eq. U1: a ZeRO stage outclassed in every group leaves the search
        allowed = zero.drop_outclassed_stages(opts, allowed, a, OUTCLASS_KEYS)
    G = len(groups)
    ends = ends or [(g,) for g in range(G)]
    if replica_ends is not None:
        p2p = _replica_p2p(est, groups, replica_ends, G, b, dp)
    else:
        p2p = _group_p2p(est, groups, ends, b, dp, cp)
    var = Variant(
        samples_per_microbatch=b, num_microbatches=m_count,
        layer_time=a["lt"], first_time=a["ft"], last_time=a["lat"],
        layer_static_mem=a["ls"], layer_act_mem=a["la"],
        first_static_mem=a["fs"], first_act_mem=a["fa"], last_static_mem=a["xs"], last_act_mem=a["xa"],
        fixed_mem=a["fx"], mem_capacity=a["cap"],
        sync_fixed=a["sf"], sync_per_layer=a["sl"], sync_first=a["s1"], sync_last=a["sL"],
        p2p_time=p2p, allowed=allowed,
    )
    return var, compute_bound(opts, groups, var, model.num_layers)


def _group_p2p(est, groups, ends, b: int, dp: int | None, cp: int = 1) -> np.ndarray:
    """The group-pair table (eq. T1b) and its mixed endpoints (eq. H5: a mixed endpoint's boundary is its
    slowest group pair)."""
    G = len(groups)
    p2p = np.zeros((len(ends), len(ends)))
    for x in range(G):
        for y in range(G):
            ga, gb = (groups[x].gpu_type, groups[x].island), (groups[y].gpu_type, groups[y].island)
            p2p[x, y] = est.p2p_time(ga, gb, b, dp_a=dp, dp_b=dp, cp=cp)
    for x, xs in enumerate(ends):
        for y, ys in enumerate(ends):
            if x >= G or y >= G:
                p2p[x, y] = max(p2p[g, h] for g in xs for h in ys)
    return p2p


#: the time, memory and sync coefficients outclassing compares (arrays of ``_price_variant``)
OUTCLASS_KEYS = ("lt", "ft", "lat", "ls", "la", "fs", "fa", "xs", "xa", "fx", "sl", "s1", "sL")


def _drop_outclassed(opts: list[Option], allowed: np.ndarray, a: dict, uniform: bool = False) -> np.ndarray:
    """Drop outclassed options: i is outclassed by j when both have the same group, tp and dp (so the
    same GPUs and the same rules), the same uniform signature when the problem is uniform (eq. U1: under a
    uniform target or ``--uniform`` another group may only be able to match i's signature), and
    j is no worse in every time, memory and sync coefficient and better in one, or equal in every one and
    earlier (eq. O1f: an exact twin, e.g. the ZeRO stages of a dp = cp = 1 option, which shard over one rank and
    price alike), so i can never be needed.

    Outclassing is a strict partial order (ties broken by index), so the options kept are exactly those no
    allowed option outclasses (a maximal outclasser is never dropped): one comparison matrix per (group, tp,
    dp[, signature]) block, [n, n, 13] booleans (measured: MoE x 3 types x 2 islands, 10-24 s as a Python
    double loop, 0.1 s here)."""
    keys = OUTCLASS_KEYS
    out = allowed.copy()
    blocks: dict = {}
    for i in np.flatnonzero(allowed).tolist():
        o = opts[i]
        blocks.setdefault((_gpus_key(o), o.signature if uniform else None), []).append(i)  # same GPUs only
    for idx in blocks.values():
        if len(idx) < 2:
            continue
        c = np.stack([np.asarray(a[k], float)[idx] for k in keys], axis=1)  # [n, keys]
        le = (c[:, None, :] <= c[None, :, :]).all(axis=2)  # le[j, i]: j no worse than i everywhere
        lt = (c[:, None, :] < c[None, :, :]).any(axis=2)  # lt[j, i]: j better than i somewhere
        earlier = np.triu(np.ones((len(idx), len(idx)), bool), k=1)  # earlier[j, i]: j < i (idx ascends)
        out[np.asarray(idx)[(le & (lt | earlier)).any(axis=0)]] = False  # le & ~lt: equal everywhere
    return out


def _gpus_key(o: Option) -> tuple:
    """What two options must share to be compared for outclassing: the same GPUs (group, tp and dp; a mixed
    option: the same replica types and counts, hence the same p2p endpoint)."""
    return tuple((r.group, r.tp, r.count) for r in o.mix) if o.mix else (o.group, o.tp, o.dp, o.cp)


def compute_bound(opts: list[Option], groups, var: Variant, num_layers: int) -> float:
    """Eq. B1: T >= (M - 1) * L / sum_g cap_g * r_g + L * min_o layer_time[o].

    r_g is the best rate of group g in layers per second per GPU, so no stage can be faster than
    perfect load balance over all GPUs (the steady-state term), and one micro-batch must still
    traverse all L layers at the best per-layer time (the fill term). No bubble, no communication
    beyond the layers' own."""
    rate = np.zeros(len(groups))
    ok = np.flatnonzero(var.allowed)
    if not len(ok):
        return math.inf
    for i in ok:
        o = opts[i]
        for g, _n in o.usage:  # a mixed option's rate per GPU counts for each of its groups (an over-estimate)
            rate[g] = max(rate[g], 1.0 / (var.layer_time[i] * o.num_gpus))
    total = sum(rate[g] * groups[g].capacity for g in range(len(groups)))
    fill = num_layers * float(var.layer_time[ok].min())
    if var.vpp > 1:  # eq. I1: T >= (M - 1/vpp) tau + sum t / vpp, tau >= the balanced load
        return interleave_bound(var, num_layers / total, fill)
    return (var.num_microbatches - 1) * num_layers / total + fill


def interleave_bound(var: Variant, balanced_s: float, fill_s: float) -> float:
    """Eq. B1 for an interleaved variant: (M - 1/vpp) * balanced + fill / vpp."""
    return interleaved_tau_weight(var.num_microbatches, var.vpp) * balanced_s + fill_s / var.vpp


def _max_stages(model, groups, options, variants, opts) -> int:
    """Stages are bounded by layers, by GPUs (one GPU at least each) and by the user/default cap."""
    cap = options.max_stages or DEFAULT_MAX_STAGES
    min_gpus = min((opts[i].num_gpus for v in variants for i in np.flatnonzero(v.allowed)), default=1)
    total = sum(g.capacity for g in groups)
    return max(1, min(model.num_layers, cap, total // max(min_gpus, 1)))


def decode(pre: Presolved, a: Assignment, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> Plan:
    """Solver answer -> Plan (stages in pipeline order, contiguous layer ranges)."""
    prob = pre.problem
    var = prob.variants[a.variant]
    times, mems = stage_times(prob, a), stage_memory(prob, a)
    stages, first = [], 0
    for st, t, mem in zip(a.stages, times, mems):
        o = prob.options[st.option]
        g = pre.groups[o.group]
        reps = tuple(Replica(gpu_type=pre.groups[r.group].gpu_type, island=pre.groups[r.group].island, tp=r.tp,
                             count=r.count, micro_batch=r.samples) for r in o.mix)
        stages.append(StagePlan(
            first_layer=first, num_layers=st.num_layers, gpu_type=g.gpu_type, island=g.island,
            tp=o.tp, dp=o.dp, ep=o.ep, etp=o.etp, recompute=o.recompute, time_s=t, memory_gib=mem / GIB,
            replicas=reps, zero=o.zero,
        ))
        first += st.num_layers
    b = var.samples_per_microbatch
    inter = {"schedule": "interleaved", "vpp": var.vpp} if var.vpp > 1 else {}
    return Plan(**inter,
        model=model.name, cluster=cluster.name, stages=tuple(stages),
        micro_batch_size=stages[0].replicas[0].micro_batch if stages[0].replicas else b // stages[0].dp,
        num_microbatches=var.num_microbatches,
        global_batch_size=training.global_batch_size, seq_len=training.seq_len, precision=training.precision,
        sequence_parallel=training.sequence_parallel, distributed_optimizer=training.distributed_optimizer,
        cp=prob.options[a.stages[0].option].cp,  # eq. CP1: every option of a variant has the same cp
    )


def presolve_document(pre: Presolved | None) -> dict:
    """What ``solve --json`` says about the search space: ``excluded`` (GPUs and profile points left out, each
    with its reason and the flag that would include it) and ``profile`` (None without one; else its sources,
    fallback, how each GPU type is priced and the points priced without a measurement)."""
    if pre is None:
        return {"excluded": [], "profile": None}
    prof = None
    if pre.profile is not None:
        prof = {**pre.profile, "priced_without_measurement": [e.as_dict() for e in pre.analytic]}
    return {"excluded": [e.as_dict() for e in pre.excluded], "profile": prof}
