"""Spec-level brute-force oracle: the best ``Plan`` for tiny specs, found without presolve.

Every Plan is enumerated straight from the specs: each contiguous split of the decoder layers into
stages (up to ``SolveOptions.max_stages``), each stage on any (GPU type, island) with any tp that
divides the attention and key/value heads and fits a node, any dp, any recompute mode of
``SolveOptions.recompute``, and any samples-per-micro-batch B dividing the global batch (or
``SolveOptions.micro_batch_sizes``) with every dp dividing B. Each plan is scored with
``Estimator.estimate`` and judged by ``check_plan`` (with the engine target); the cheapest accepted
plan is the optimum. Nothing of presolve is used, so comparing ``planner.solve`` against this
checks presolve's enumeration, its pruning (memory, dominance, eq. B1) and ``decode`` at once.

Mixed stages (formulations/ eqs. H1-H7), unless ``SolveOptions.mixed_stages`` is "off" or the target cannot
run them: two (GPU type, island) groups of one island, each with all, half or a quarter of its GPUs in whole
nodes, any tp that divides heads and kv heads, fits a node and divides that count, the same recompute mode,
ep 1, and EVERY integer split of the B samples (count_a·m_a + count_b·m_b = B, m >= 1) — presolve keeps only
the fastest split per combination, so a plan where another split wins on memory would show up here.

Context parallelism (formulations/ eq. CP1): one cp per plan, every cp up to the largest group whose 2*cp
divides seq_len under ``SolveOptions.cp`` "auto" (presolve's candidates are powers of two: an oracle with every
integer is stricter), each stage then on tp*dp*cp GPUs.

MoE models (eq. CP4): every ep that divides the experts and every etp of ``SolveOptions.etp`` ("auto": every etp
up to a node; presolve's are powers of two) per single-type stage, where ep*etp divides tp*dp*cp (the expert grid;
check_plan's ``ep.fold``, so dropping the others early changes nothing). Dense models: ep = etp = 1.

ZeRO (eq. Z1): per single-type stage, every stage of ``SolveOptions.zero`` ("auto": 0-3, check_plan drops what the
runtime and target cannot run); None (the runtime's) when ``zero`` is None. Mixed stages keep the runtime's.

Interleaving (eqs. I1-I5): one vpp per plan, each of ``SolveOptions.vpp`` (1 alone; N: 1 and N; "auto": 1-4)
where the target interleaves. An interleaved plan needs P >= 3 stages (Megatron's pp > 2 without
--overlap-p2p-comm, eq. I5: the one rule of the plan space written here rather than in check_plan, which does not
hold it) and M a multiple of P (check_plan's ``schedule.vpp_microbatches``, left to it). Each stage's layers are
split over its chunks as the plan file says (``interleave.chunk_layers``, priced by the estimator).

Plans using more GPUs of a (type, island) than it has are skipped before scoring (check_plan would
reject them as ``gpus.*``); everything else is left to check_plan, which is called in increasing
order of estimated time until one plan passes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from haap_milp.check import check_plan
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator
from haap_milp.specs import (
    ClusterSpec,
    GPUSpec,
    IslandLink,
    ModelSpec,
    NodeGroup,
    Plan,
    Replica,
    SolveOptions,
    StagePlan,
    TrainingSpec,
)
from haap_milp.targets import capabilities


@dataclass(frozen=True)
class OracleResult:
    plan: Plan | None
    time_s: float | None
    plans_scored: int
    plans_checked: int


def _groups(cluster: ClusterSpec) -> dict[tuple[str, str], tuple[int, int]]:
    """(GPU type, island) -> (GPUs, largest node size)."""
    out: dict[tuple[str, str], list[int]] = {}
    for ng in cluster.node_groups:
        g = out.setdefault((ng.gpu.name, ng.island), [0, 0])
        g[0] += ng.num_gpus
        g[1] = max(g[1], ng.gpus_per_node)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _compositions(n: int, parts: int):
    for cuts in itertools.combinations(range(1, n), parts - 1):
        b = (0, *cuts, n)
        yield tuple(b[i + 1] - b[i] for i in range(parts))


def zero_set(options: SolveOptions) -> tuple:
    """ZeRO stages the oracle gives a single-type stage (formulations/ eq. Z1): the runtime's only (None) unless
    ``options.zero`` asks for a search; "auto" enumerates all four and leaves to check_plan which can run."""
    if options.zero is None:
        return (None,)
    return (0, 1, 2, 3) if options.zero == "auto" else tuple(options.zero)


def etp_set(options: SolveOptions, per_node: int) -> tuple[int, ...]:
    """etp values of an MoE stage (eq. CP4): "auto" every etp that fits a node, else the one asked."""
    return tuple(range(1, per_node + 1)) if options.etp == "auto" else (int(options.etp),)


def expert_grids(model: ModelSpec, ranks: int, etps) -> list[tuple[int, int]]:
    """(ep, etp) of a stage of ``ranks`` = tp*dp*cp GPUs: (1, 1) for a dense model; for an MoE model every ep
    dividing the experts and every etp of ``etps`` dividing the expert FFN, ep*etp dividing the ranks."""
    if not model.is_moe:
        return [(1, 1)]
    return [(ep, etp) for ep in range(1, model.num_experts + 1) if model.num_experts % ep == 0
            for etp in etps if model.expert_ffn % etp == 0 and ranks % (ep * etp) == 0]


def stage_configs(model: ModelSpec, cluster: ClusterSpec, b: int, recompute, zeros=(None,), cp: int = 1,
                  etps=(1,)) -> list[tuple]:
    """(gpu_type, island, tp, dp, recompute, zero, ep, etp) a stage may use with B = b samples per micro-batch and
    context-parallel degree cp (tp*dp*cp GPUs); ``etps`` the etp values an MoE stage may take (capped by a node)."""
    out = []
    for (gpu, island), (cap, per_node) in _groups(cluster).items():
        for tp in range(1, per_node + 1):
            if model.num_heads % tp or model.kv_heads % tp:
                continue
            for dp in range(1, cap // (tp * cp) + 1):
                if b % dp:
                    continue
                grids = expert_grids(model, tp * dp * cp, [e for e in etps if e <= per_node])
                out.extend((gpu, island, tp, dp, rc, z, ep, etp) for rc in recompute for z in zeros
                           for ep, etp in grids)
    return out


def _mixed_sizes(cap: int, per_node: int) -> list[int]:
    return sorted({n - n % per_node for n in (cap, cap // 2, cap // 4) if n - n % per_node >= per_node})


def mixed_configs(model: ModelSpec, cluster: ClusterSpec, b: int, recompute) -> list[tuple]:
    """("mixed", ((gpu, island, tp, count, samples), ...), recompute): mixed stages with B = b (eqs. H1, H2)."""
    groups = sorted(_groups(cluster).items())
    out = []
    for (ka, (cap_a, pn_a)), (kb, (cap_b, pn_b)) in itertools.combinations(groups, 2):
        if ka[1] != kb[1]:
            continue
        for sa, sb in itertools.product(_mixed_sizes(cap_a, pn_a), _mixed_sizes(cap_b, pn_b)):
            for ta, tb in itertools.product(range(1, pn_a + 1), range(1, pn_b + 1)):
                if any(model.num_heads % t or model.kv_heads % t for t in (ta, tb)) or sa % ta or sb % tb:
                    continue
                na, nb = sa // ta, sb // tb
                for ma in range(1, b):
                    mb, rest = divmod(b - na * ma, nb)
                    if rest or mb < 1:
                        continue
                    reps = ((*ka, ta, na, ma), (*kb, tb, nb, mb))
                    out.extend(("mixed", reps, rc) for rc in recompute)
    return out


def _usage(cfg, cp: int = 1) -> list[tuple[tuple[str, str], int]]:
    if cfg[0] == "mixed":
        return [((g, i), tp * n) for g, i, tp, n, _m in cfg[1]]
    gpu, island, tp, dp, *_ = cfg
    return [((gpu, island), tp * dp * cp)]


def cp_values(options: SolveOptions, seq_len: int, most_gpus: int) -> list[int]:
    """Context-parallel degrees to enumerate: ``options.cp`` as a number, or under "auto" every cp up to the
    largest group whose 2*cp divides the sequence (Megatron's load-balanced chunks); one cp per plan."""
    if options.cp != "auto":
        return [options.cp]
    return [c for c in range(1, most_gpus + 1) if c == 1 or seq_len % (2 * c) == 0]


def vpp_values(options: SolveOptions) -> tuple[int, ...]:
    """Model chunks per stage to enumerate (eq. I1): 1 alone unless the target interleaves; "auto" 1-4; N: 1, N."""
    if not capabilities(options.target).interleave or options.vpp == 1:
        return (1,)
    return (1, 2, 3, 4) if options.vpp == "auto" else (1, int(options.vpp))


MIN_INTERLEAVED_STAGES = 3  # eq. I5: Megatron's pp > 2 for interleaving without --overlap-p2p-comm


def _stage(cfg, first: int, n: int) -> StagePlan:
    if cfg[0] == "mixed":
        reps = tuple(Replica(gpu_type=g, island=i, tp=tp, count=c, micro_batch=m) for g, i, tp, c, m in cfg[1])
        r0 = reps[0]
        return StagePlan(first_layer=first, num_layers=n, gpu_type=r0.gpu_type, island=r0.island, tp=r0.tp,
                         dp=sum(r.count for r in reps), recompute=cfg[2], replicas=reps)
    gpu, island, tp, dp, rc, z, ep, etp = cfg
    return StagePlan(first_layer=first, num_layers=n, gpu_type=gpu, island=island, tp=tp, dp=dp, recompute=rc, zero=z,
                     ep=ep, etp=etp)


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions):
    """Every candidate Plan (see module docstring)."""
    fixed = [k for k in ("vpp", "cp", "zero") if getattr(options, k) == "default"]
    assert not fixed, f"the oracle enumerates explicit search spaces; resolve {fixed} = 'default' (eqs. D1-D3) first"
    gbs = training.global_batch_size
    sizes = options.micro_batch_sizes or tuple(b for b in range(1, gbs + 1) if gbs % b == 0)
    caps = {k: v[0] for k, v in _groups(cluster).items()}
    max_p = min(model.num_layers, options.max_stages or model.num_layers)
    etps = etp_set(options, max(v[1] for v in _groups(cluster).values()))
    for b, cp in itertools.product(sorted(set(sizes)), cp_values(options, training.seq_len, max(caps.values()))):
        if gbs % b:
            continue
        configs = stage_configs(model, cluster, b, options.recompute, zero_set(options), cp, etps)
        if cp == 1 and options.mixed_stages != "off" and capabilities(options.target).mixed_stages:
            configs += mixed_configs(model, cluster, b, options.recompute)
        for p in range(1, max_p + 1):
            for combo in itertools.product(configs, repeat=p):
                used: dict = {}
                for cfg in combo:
                    for k, n in _usage(cfg, cp):
                        used[k] = used.get(k, 0) + n
                if any(n > caps[k] for k, n in used.items()):
                    continue
                mbs = combo[0][1][0][4] if combo[0][0] == "mixed" else b // combo[0][3]
                vpps = [v for v in vpp_values(options) if v == 1 or p >= MIN_INTERLEAVED_STAGES]
                for comp in _compositions(model.num_layers, p):
                    stages, first = [], 0
                    for cfg, n in zip(combo, comp):
                        stages.append(_stage(cfg, first, n))
                        first += n
                    for v in vpps:
                        yield Plan(model=model.name, cluster=cluster.name, stages=tuple(stages),
                                   micro_batch_size=mbs, num_microbatches=gbs // b, global_batch_size=gbs,
                                   seq_len=training.seq_len, precision=training.precision,
                                   sequence_parallel=training.sequence_parallel,
                                   distributed_optimizer=training.distributed_optimizer, cp=cp, vpp=v,
                                   schedule="interleaved" if v > 1 else "1f1b")


def score_plans(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions,
                estimator: Estimator) -> list[tuple[float, Plan]]:
    """Every enumerated plan the estimator can price, with its iteration time, cheapest first."""
    scored = []
    for plan in enumerate_plans(model, cluster, training, options):
        try:
            scored.append((estimator.estimate(plan).iteration_time_s, len(scored), plan))
        except HaapInputError:  # check_plan rejects these too (memory.estimate)
            continue
    scored.sort(key=lambda x: x[:2])
    return [(t, plan) for t, _, plan in scored]


def first_valid(scored: list[tuple[float, Plan]], model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                target: str, estimator: Estimator, accept=None) -> OracleResult:
    """The cheapest plan check_plan accepts for ``target`` (``accept(plan)`` filters further)."""
    checked = 0
    for t, plan in scored:
        if accept is not None and not accept(plan):
            continue
        checked += 1
        if not check_plan(plan, model, cluster, training, target=target, estimator=estimator):
            return OracleResult(plan, t, len(scored), checked)
    return OracleResult(None, None, len(scored), checked)


def best_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions,
              estimator: Estimator | None = None, accept=None) -> OracleResult:
    """The oracle optimum: the cheapest enumerated plan that check_plan accepts."""
    est = estimator or Estimator(model, cluster, training)
    return first_valid(score_plans(model, cluster, training, options, est), model, cluster, training,
                       options.target, est, accept)


# Tiny specs the oracle enumerates in about a second: 4 layers on 2 + 2 GPUs.
TINY_MODEL = ModelSpec(name="tiny-4l", num_layers=4, hidden=2048, ffn_hidden=8192, num_heads=16, vocab_size=32000)
TINY_TRAINING = TrainingSpec(global_batch_size=4, seq_len=2048)


def tiny_cluster(mem_a: float, mem_h: float, link_gbps: float | None = None) -> ClusterSpec:
    """One node of 2 A100 and one of 2 H100 (datasheet speeds) with shrunk memory so that the tiny
    model is memory-bound; on two islands joined by ``link_gbps`` GB/s when given."""
    a = GPUSpec(name="a100-80g", memory_gib=mem_a, bf16_tflops=312, fp16_tflops=312, hbm_bandwidth_gbps=2039,
                intra_node_bandwidth_gbps=300)
    h = GPUSpec(name="h100-80g", memory_gib=mem_h, bf16_tflops=989, fp16_tflops=989, hbm_bandwidth_gbps=3350,
                intra_node_bandwidth_gbps=450)
    isl = ("east", "west") if link_gbps else ("main", "main")
    return ClusterSpec(name=f"a{mem_a:g}+h{mem_h:g}" + (f"@{link_gbps:g}" if link_gbps else ""), node_groups=(
        NodeGroup(gpu=a, num_nodes=1, gpus_per_node=2, nic_bandwidth_gbps=50, island=isl[0]),
        NodeGroup(gpu=h, num_nodes=1, gpus_per_node=2, nic_bandwidth_gbps=50, island=isl[1])),
        island_links=(IslandLink(a="east", b="west", bandwidth_gbps=link_gbps),) if link_gbps else ())
