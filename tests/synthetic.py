"""Synthetic, realistic-shaped ``Problem`` instances for solver tests and benchmarks.

Not a cost model (that is ``haap_milp.estimator``): a compact stand-in with the right shapes
and magnitudes so solvers can be exercised without the estimator.

* ``random_problem(src, ...)``: small instances (2-4 groups, a few options each, 1-3
  micro-batch variants, 4-12 layers, tight memory, cheap intra-group and expensive
  cross-island p2p). ``src`` is a ``numpy.random.Generator``, an int seed, or a hypothesis
  ``draw`` function.
* ``large_problem(rng, num_gpus, num_types, num_layers, ...)``: presolve-sized instances
  (GPU groups x tp in {1,2,4,8} x dp = B/m x recompute; 50-400 options per variant).

Magnitudes follow the usual transformer accounting: 24*s*h^2 + 4*s^2*h forward FLOPs per
layer and sample, x3 for forward+backward (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters", eq. 3); activations s*b*h*(34 + 5*a*s/h) bytes
per layer without recompute, 34*s*b*h with selective and 2*s*b*h with full recompute
(Korthikanti et al. 2022, "Reducing Activation Recomputation", Table 2); 16 bytes per
parameter of weights+grads+Adam state, the 12 optimizer bytes sharded over dp
(distributed optimizer, Rajbhandari et al. 2020, ZeRO-1).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from haap_milp.pipeline import fits_memory
from haap_milp.problem import Assignment, Option, Problem, Stage, Variant, stage_memory, violations
from haap_milp.solvers import brute

GIB = 2**30
RECOMPUTE_FLOP_FACTOR = {"none": 1.0, "selective": 1.05, "full": 4.0 / 3.0}  # extra fwd for full


@dataclass(frozen=True)
class GpuType:
    name: str
    tflops: float  # dense bf16 peak, TFLOP/s (vendor datasheets)
    memory_gib: float
    nvlink_gbps: float  # GB/s per direction inside a node
    mfu: float  # achieved fraction of peak for a transformer layer


GPU_TYPES = (
    GpuType("h100", 989.0, 80.0, 450.0, 0.45),
    GpuType("a100", 312.0, 80.0, 300.0, 0.50),
    GpuType("v100", 125.0, 32.0, 150.0, 0.45),
    GpuType("l40s", 362.0, 48.0, 32.0, 0.40),
)


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    heads: int
    seq: int
    vocab: int

    @property
    def layer_params(self) -> float:
        return 12.0 * self.hidden**2  # Narayanan et al. 2021, sec. 3.3

    def layer_flops(self, samples: float) -> float:
        """fwd+bwd FLOPs of one layer (Narayanan et al. 2021, eq. 3 per layer)."""
        s, h = self.seq, self.hidden
        return 3.0 * samples * (24.0 * s * h * h + 4.0 * s * s * h)

    def layer_act_bytes(self, samples: float, tp: int, recompute: str) -> float:
        """Korthikanti et al. 2022, Table 2 (bf16, tensor parallel without sequence parallel)."""
        s, h, a = self.seq, self.hidden, self.heads
        if recompute == "full":
            return 2.0 * s * samples * h
        per = 34.0 if recompute == "selective" else 34.0 + 5.0 * a * s / h
        return s * samples * h * per / tp


def _seed_rng(src) -> np.random.Generator:
    if isinstance(src, np.random.Generator):
        return src
    if callable(src):  # a hypothesis draw
        from hypothesis import strategies as st

        return np.random.default_rng(src(st.integers(0, 2**32 - 1)))
    return np.random.default_rng(int(src))


def _option_costs(model: ModelShape, gpu: GpuType, opt: Option, b: int, dp_bw_gbps: float) -> dict:
    """One option's cost coefficients for B = b samples per micro-batch."""
    per_rep = b / opt.dp
    flops = model.layer_flops(per_rep) * RECOMPUTE_FLOP_FACTOR[opt.recompute]
    compute_s = flops / (opt.tp * gpu.tflops * 1e12 * gpu.mfu)
    # tp: 4 all-reduces of s*b*h bf16 per layer fwd+bwd, ring 2(tp-1)/tp (Narayanan et al. 2021, sec. 3.2)
    tp_bytes = 4 * 2.0 * model.seq * per_rep * model.hidden * 2 * (opt.tp - 1) / opt.tp
    lt = compute_s + tp_bytes / (gpu.nvlink_gbps * 1e9)
    head_flops = 3.0 * 2.0 * model.seq * per_rep * model.hidden * model.vocab
    head_s = head_flops / (opt.tp * gpu.tflops * 1e12 * gpu.mfu)
    emb_params = model.vocab * model.hidden / opt.tp
    p_layer = model.layer_params / opt.tp
    static_per_param = 2.0 + 4.0 + 12.0 / opt.dp  # bf16 weights, fp32 grads, sharded Adam state
    grad_sync = 2.0 * (opt.dp - 1) / opt.dp * 2.0 / (dp_bw_gbps * 1e9)  # ring reduce-scatter+all-gather
    return dict(  # noqa: C408 - keyword form mirrors the Variant fields
        layer_time=lt, first_time=0.02 * lt, last_time=head_s,
        layer_static_mem=p_layer * static_per_param,
        layer_act_mem=model.layer_act_bytes(per_rep, opt.tp, opt.recompute),
        first_static_mem=emb_params * static_per_param, first_act_mem=2.0 * model.seq * per_rep * model.hidden,
        last_static_mem=emb_params * static_per_param,
        last_act_mem=4.0 * model.seq * per_rep * model.vocab / opt.tp,
        fixed_mem=2.0 * GIB, mem_capacity=0.92 * gpu.memory_gib * GIB,
        sync_fixed=2e-3, sync_per_layer=p_layer * grad_sync, sync_first=emb_params * grad_sync,
        sync_last=emb_params * grad_sync,
    )


def _p2p(model: ModelShape, b: int, islands: list[int], rng, ib_gbps: float,
         cross_gbps: tuple[float, float] = (0.5, 3.0)) -> np.ndarray:
    """Per micro-batch fwd activation + bwd gradient, s*B*h bf16 each way."""
    bytes_ = 2 * 2.0 * model.seq * b * model.hidden
    g = len(islands)
    bw = np.empty((g, g))
    for i in range(g):
        for j in range(g):
            if i == j:
                bw[i, j] = ib_gbps
            elif islands[i] == islands[j]:
                bw[i, j] = ib_gbps * rng.uniform(0.4, 0.9)
            else:
                bw[i, j] = rng.uniform(*cross_gbps)  # slow inter-island link
    bw = np.minimum(bw, bw.T)
    return bytes_ / (bw * 1e9)


def _variant(model, gpus, options, b, m, islands, rng, ib_gbps, gpus_per_node, mem_scale,
             cross_gbps=(0.5, 3.0)) -> Variant:
    cols: dict[str, list] = {}
    for o in options:
        gpu = gpus[o.group]
        dp_bw = gpu.nvlink_gbps if o.num_gpus <= gpus_per_node else min(ib_gbps, 25.0)  # one HDR NIC per GPU
        for k, val in _option_costs(model, gpu, o, b, dp_bw).items():
            cols.setdefault(k, []).append(val)
    arr = {k: np.asarray(v, dtype=float) for k, v in cols.items()}
    arr["mem_capacity"] = arr["mem_capacity"] * mem_scale[[o.group for o in options]]
    allowed = np.array([b % o.dp == 0 for o in options])
    one = arr["fixed_mem"] + arr["layer_static_mem"] + arr["layer_act_mem"]
    allowed &= one <= arr["mem_capacity"]
    return Variant(samples_per_microbatch=b, num_microbatches=m,
                   p2p_time=_p2p(model, b, islands, rng, ib_gbps, cross_gbps),
                   allowed=allowed, **arr)


def random_problem(src, *, num_groups: int | None = None, num_layers: int | None = None,
                   max_stages: int | None = None, num_variants: int | None = None, max_options: int = 8,
                   uniform: bool | None = None, same_tp_first_last: bool | None = None) -> Problem:
    """A small random instance (see module docstring); brute force can enumerate it."""
    rng = _seed_rng(src)
    g = num_groups or int(rng.integers(2, 5))
    L = num_layers or int(rng.integers(4, 9))
    K = max_stages or int(rng.integers(1, 4))
    nv = num_variants or int(rng.integers(1, 4))
    types = [GPU_TYPES[int(i)] for i in rng.integers(0, len(GPU_TYPES), size=g)]
    islands = [int(i) for i in rng.integers(0, 2, size=g)]
    caps = tuple(int(c) for c in rng.integers(1, 9, size=g))
    model = ModelShape(hidden=int(rng.choice([2048, 4096, 5120])), heads=32, seq=2048, vocab=32000)
    pool = [Option(gi, tp, dp, 1, rc) for gi in range(g) for tp in (1, 2) for dp in (1, 2)
            for rc in ("none", "selective", "full") if tp * dp <= caps[gi]]
    pick = rng.choice(len(pool), size=min(max_options, len(pool)), replace=False)
    options = tuple(pool[i] for i in sorted(pick))
    # memory scale per group: chosen so a typical option holds 1..L layers (tight memory)
    ref = [_option_costs(model, types[o.group], o, 2, 100.0) for o in options]
    scale = np.ones(g)
    for gi in range(g):
        mine = [r for r, o in zip(ref, options) if o.group == gi] or [ref[0]]
        per_layer = np.median([r["layer_static_mem"] + 2 * r["layer_act_mem"] for r in mine])
        want = 2.0 * GIB + per_layer * rng.uniform(1.0, 0.8 * L) + mine[0]["last_static_mem"] * rng.uniform(0, 1.5)
        scale[gi] = want / (0.92 * types[gi].memory_gib * GIB)
    gbs = int(rng.choice([4, 8, 16]))
    bs = sorted(rng.choice([1, 2, 4], size=nv, replace=False).tolist())
    variants = tuple(_variant(model, types, options, b, max(1, gbs // b), islands, rng, 25.0, 8, scale) for b in bs)
    return Problem(
        num_layers=L, max_stages=K, groups=tuple(f"{t.name}@isl{i}#{n}" for n, (t, i) in enumerate(zip(types, islands))),
        group_capacity=caps, options=options, variants=variants,
        uniform=bool(rng.random() < 0.15) if uniform is None else uniform,
        same_tp_first_last=bool(rng.random() < 0.25) if same_tp_first_last is None else same_tp_first_last,
    )


def large_problem(src, *, num_gpus: int = 1024, num_types: int = 3, num_layers: int = 80, max_stages: int = 32,
                  hidden: int = 8192, heads: int = 64, seq: int = 4096, gbs: int = 1024,
                  micro_batches: tuple[int, ...] = (8, 16, 32), islands: int = 2,
                  recompute: tuple[str, ...] = ("none", "selective", "full"),
                  cross_island_gbps: tuple[float, float] = (5.0, 12.5), node_link_gbps: float = 200.0) -> Problem:
    """A presolve-sized instance: ``num_gpus`` split over ``num_types`` GPU types (each type a
    group; types alternate over ``islands``), options = group x tp {1,2,4,8} x dp = B/m for
    m in {1,2,4,8} x recompute, one variant per B in ``micro_batches``. Stage-to-stage p2p inside
    an island runs over all rails of a node (``node_link_gbps``, 8 x 200 Gb/s HDR = 200 GB/s),
    between islands over a shared link of ``cross_island_gbps`` GB/s."""
    rng = _seed_rng(src)
    types = [GPU_TYPES[i % len(GPU_TYPES)] for i in range(num_types)]
    share = rng.dirichlet(np.full(num_types, 4.0))
    caps = [max(8, round(num_gpus * s / 8) * 8) for s in share]
    caps[0] += num_gpus - sum(caps)
    caps = [max(8, c) for c in caps]
    isl = [i % islands for i in range(num_types)]
    model = ModelShape(hidden=hidden, heads=heads, seq=seq, vocab=128256)
    options = []
    dps = sorted({b // m for b in micro_batches for m in (1, 2, 4, 8) if b % m == 0})
    for gi in range(num_types):
        for tp in (1, 2, 4, 8):
            for dp in dps:
                for rc in recompute:
                    if tp * dp <= caps[gi]:
                        options.append(Option(gi, tp, dp, 1, rc))
    options = tuple(options)
    scale = np.ones(num_types)
    variants = tuple(_variant(model, types, options, b, gbs // b, isl, rng, node_link_gbps, 8, scale, cross_island_gbps)
                     for b in micro_batches)
    kept = []
    for v in variants:
        per_b = {v.samples_per_microbatch // m for m in (1, 2, 4, 8) if v.samples_per_microbatch % m == 0}
        kept.append(v.allowed & np.array([o.dp in per_b for o in options]))
    variants = tuple(_replace_allowed(v, a) for v, a in zip(variants, kept))
    return Problem(num_layers=num_layers, max_stages=max_stages,
                   groups=tuple(f"{t.name}@isl{i}" for t, i in zip(types, isl)), group_capacity=tuple(caps),
                   options=options, variants=variants, stats={"generator": "large_problem"})


def _replace_allowed(v: Variant, allowed: np.ndarray) -> Variant:
    from dataclasses import replace

    return replace(v, allowed=allowed)


def count_options(problem: Problem) -> list[int]:
    """Allowed options per variant."""
    return [int(np.count_nonzero(v.allowed)) for v in problem.variants]


def with_blocking_sends(problem: Problem, scale: float) -> Problem:
    """The same problem with sends blocking (eq. T2b) and p2p prices scaled so that eq. T2b binds in some plans."""
    from dataclasses import replace

    return replace(problem, p2p_blocking=True,
                   variants=tuple(replace(v, p2p_time=np.asarray(v.p2p_time) * scale) for v in problem.variants))


__all__ = ["GPU_TYPES", "ModelShape", "count_options", "large_problem", "random_problem", "with_blocking_sends"]


def assert_exact_solvers_match_brute(problem: Problem, options, rel: float = 1e-3, check_bound: bool = False):
    """CP-SAT and the MILP return brute force's status and, when it is OPTIMAL, a valid plan whose objective is
    evaluate's (to ``rel``) and brute force's optimum (within CP-SAT's stated rounding). Returns brute force's
    result."""
    import pytest

    from haap_milp.problem import evaluate, violations
    from haap_milp.solvers import get_solver

    brute = get_solver("brute")(problem, options)
    for name in ("cpsat", "milp"):
        res = get_solver(name)(problem, options)
        assert res.status == brute.status, (name, res.status, brute.status, res.message)
        if brute.status != "OPTIMAL":
            continue
        assert violations(problem, res.assignment) == []
        assert res.objective_s == pytest.approx(evaluate(problem, res.assignment), rel=rel)
        tol = res.stats.get("tolerance_s", 0.0) + 1e-6 * brute.objective_s
        assert brute.objective_s * (1 - 1e-9) <= res.objective_s <= brute.objective_s + tol
        if check_bound:
            assert res.bound_s <= brute.objective_s * (1 + 1e-9)
    return brute


def solve_against_brute(problem: Problem, name: str, options, tag=None):
    """``name``'s result on ``problem`` when brute force proves an optimum there (None otherwise), after asserting the
    same status, brute force's optimum (within the solver's stated rounding) and a bound no higher than it (``tag``,
    e.g. the seed, in the failure messages)."""
    from haap_milp.solvers import get_solver

    brute = get_solver("brute")(problem, options)
    res = get_solver(name)(problem, options)
    assert res.status == brute.status, (tag, res.status, brute.status, res.message)
    if brute.status != "OPTIMAL":
        return None
    tol = res.stats.get("tolerance_s", 0.0) + 1e-6 * brute.objective_s
    assert brute.objective_s * (1 - 1e-9) <= res.objective_s <= brute.objective_s + tol, (tag, res.objective_s)
    assert res.bound_s <= brute.objective_s * (1 + 1e-9), (tag, res.bound_s)
    return res


def all_models_large(monkeypatch) -> None:
    """Every node model of the search counts as large (no direct route to the engine, eq. N17b), so the LP runs on
    each node and what follows it (eqs. N17, N17c, N17e) decides."""
    import dataclasses

    from haap_milp.solvers.common import branch_and_bound as bb

    policy = bb.node_policy
    monkeypatch.setattr(bb, "node_policy", lambda problem: dataclasses.replace(policy(problem), small_model=0))


def with_binding_budget(problem, rng, opts):
    """``problem`` with a random per-group price budget (eq. W1) set to 60 % of what its unbudgeted brute-force
    optimum spends, so that the budget binds; None when that optimum is not proven."""
    from dataclasses import replace

    from haap_milp.problem import Budget
    from haap_milp.solvers import get_solver

    free = get_solver("brute")(problem, opts)
    if free.status != "OPTIMAL":
        return None
    price = rng.integers(1, 5, len(problem.groups))
    w = np.array([sum(int(price[g]) * n for g, n in o.usage) for o in problem.options], np.int64)
    used = sum(int(w[s.option]) for s in free.assignment.stages)
    return replace(problem, budget=Budget(w, max(1, int(0.6 * used)), "test"))


def feasible_assignments(problem):
    """Every assignment of ``problem`` that ``violations`` accepts (every variant, stage count, option tuple and
    layer split): the enumeration behind the objective oracles of tests/test_band_search.py and test_frontier.py."""
    import itertools

    from haap_milp.problem import Assignment, Stage, violations
    from haap_milp.solvers import brute

    for v, var in enumerate(problem.variants):
        ok = np.flatnonzero(var.allowed)
        for p in range(1, problem.max_stages + 1):
            for combo in itertools.product(ok, repeat=p):
                for comp in brute.compositions(problem.num_layers, p):
                    a = Assignment(v, tuple(Stage(int(o), int(n)) for o, n in zip(combo, comp)))
                    if not violations(problem, a):
                        yield a


def variant_nodes(problem):
    """Per variant v with a finite bound, the node over its whole tau range: (v, PathDP over tau <= 1.01 x the worst
    period, tau_lb), for the node-level oracles of the stage DPs (tests/test_segment_dp.py, tests/test_group_split.py)."""
    import math

    from haap_milp.solvers.common.bounds import variant_bound
    from haap_milp.solvers.common.branch_and_bound import _worst_tau
    from haap_milp.solvers.common.slot_bounds import build_tables
    from haap_milp.solvers.common.stage_dp import PathDP

    for v in range(len(problem.variants)):
        t0 = build_tables(problem, v)
        vb = variant_bound(problem, t0)
        if not math.isfinite(vb.total_s):
            continue
        b = max(_worst_tau(t0), vb.tau_lb) * 1.01
        t = build_tables(problem, v, b)
        if t.p_min > 0:
            yield v, PathDP(problem, t, b, t.p_min, t.p_max), vb.tau_lb


def any_interleaved_copies(variants, vpps, max_stages: int, num_layers: int) -> list:
    """``interleave.interleaved_variants`` with every stage count of eq. I5's divisibility rules, also where
    L - P + 1 < vpp (copies the planner leaves out: every split leaves a virtual round empty): the bounds, stage DPs
    and node models must hold on any copy, and the 5-7 layer problems of the bound tests would keep fewer copies
    otherwise. Scaling L by max(vpps) lifts that rule alone (P stays at most max_stages and L)."""
    from haap_milp.interleave import interleaved_variants

    return interleaved_variants(variants, vpps, min(max_stages, num_layers), num_layers * max(vpps))


def feasible_plans(problem, variants=None, max_stages=None):
    """``synthetic.feasible_assignments`` (the same plans, in its order), of ``variants`` (default: all) up to
    ``max_stages`` stages, without asking ``violations`` about plans that must break a rule in every layer split:
    an option tuple over a group's GPUs (eq. G1), out of the budget's band (eqs. W1, W1b), of mixed signatures (eq.
    U1) or tps at the ends (eq. U2), an interleaved variant's other stage counts (eq. I5), and a stage whose option
    does not hold its layers at its place (eq. M2, ``problem.stage_memory``: a stage's bytes depend only on its own
    option, layers and place). ``violations`` still judges every plan yielded;
    test_floor_dive.py checks the two agree. The brute-force oracle of test_floor_dive.py, test_interleaved_links.py,
    test_polish_variants.py, test_segment_dp.py, test_path_prune.py and test_uniform_signatures.py, whose time went to
    ``violations`` on plans that break eqs. G1 and M2: measured 17.3 -> 2.4 s on the interleaved floor dive's problems, 25.6 -> 3.5 s on
    test_interleaved_links.py's node test, 9.1 -> 1.9 s on test_path_prune.py's."""
    use = np.zeros((problem.num_options, len(problem.group_capacity)), np.int64)
    for i, o in enumerate(problem.options):
        for g, n in o.usage:
            use[i, g] += n
    sig, tp, budget, L = [o.signature for o in problem.options], [o.tp for o in problem.options], problem.budget, \
        problem.num_layers
    for v in range(len(problem.variants)) if variants is None else variants:
        var = problem.variants[v]
        ok = np.flatnonzero(var.allowed).tolist()
        for p in range(1, min(problem.max_stages, max_stages or problem.max_stages, L) + 1):
            if not ok or (var.vpp > 1 and var.num_stages and p != var.num_stages):  # eq. I5
                continue
            fits = np.zeros((p, problem.num_options, L + 1), bool)  # [place, option, layers]: eq. M2
            for o in ok:
                for n in range(1, L - p + 2):
                    mem = stage_memory(problem, Assignment(v, (Stage(o, n),) * p))
                    fits[:, o, n] = [fits_memory(m, var.mem_capacity[o]) for m in mem]
            comps = brute.compositions(L, p)
            for combo in itertools.product(ok, repeat=p):
                if (use[list(combo)].sum(axis=0) > problem.group_capacity).any():  # eq. G1
                    continue
                if budget is not None and not budget.lower <= budget.used(combo) <= budget.limit:  # eqs. W1, W1b
                    continue
                if (problem.uniform and len({sig[o] for o in combo}) > 1) or \
                        (problem.same_tp_first_last and tp[combo[0]] != tp[combo[-1]]):  # eqs. U1, U2
                    continue
                for comp in comps[fits[np.arange(p), np.asarray(combo), comps].all(axis=1)]:
                    a = Assignment(v, tuple(Stage(int(o), int(n)) for o, n in zip(combo, comp)))
                    if not violations(problem, a):
                        yield a
