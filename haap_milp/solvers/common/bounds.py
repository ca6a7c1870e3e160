"""Lower bounds (eqs. B1, B2) and human-readable infeasibility reasons.

Equation labels: formulations/README.md.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass

import numpy as np

from haap_milp.pipeline import TIME_RTOL, sigma_share
from haap_milp.problem import Problem
from haap_milp.solvers.common import joint_cover, rest_dp
from haap_milp.solvers.common.fill_lp import capped_fill, fixed_count_fill, memory_layers
from haap_milp.solvers.common.slot_bounds import Tables, build_tables, link_half, send_floor, subset

COVER_TOL = 1e-6  # layers: eq. B2b's real-valued coverage against the integer layer count
USE_FILL_LP = True  # eq. B2e
USE_STAGE_CAP = True  # eq. B2g
USE_JOINT_COVER = True  # eq. B2h
USE_FORCED_SYNC = True  # eq. B2j
USE_SYNC_FLOOR = True  # eq. B2k
USE_END_STAGES = True  # eq. B2l
USE_JOINT_REST = True  # eq. B2n
SYNC_FLOOR_STEPS = 12  # eq. B2k's bisection on the sync cap S (each step one coverage, eq. B2)
SYNC_FLOOR_ENDS = True  # eq. B2k with the end stages' own syncs (the embedding's and the head's) under eq. B2l


@dataclass(frozen=True)
class VariantBound:
    """T >= (M - 1) * tau_lb + rest_lb for every plan of the variant (eq. B2)."""

    tau_lb: float  # lower bound on max_j t_j
    rest_lb: float  # lower bound on sum_j t_j + sum_j c_j + max_j s_j
    total_s: float
    reason: str = ""  # why the variant has no plan (total_s = inf)


def _knapsack_max(weights: np.ndarray, values: np.ndarray, cap: int) -> float:
    """Unbounded knapsack: most value with total weight <= cap (items reusable; integer weights, real values)."""
    f, unit = _knapsack_table(weights, values, cap)
    return float(f[cap // unit])


def _knapsack_table(weights: np.ndarray, values: np.ndarray, cap: int) -> tuple[np.ndarray, int]:
    """The unbounded knapsack's most value at every capacity up to ``cap``: (f, unit), f[c // unit] the most value
    within weight c. Weights and cap are first divided by the weights' gcd (GPU counts are mostly multiples of 8:
    exact, as every sum of weights is a multiple of it, and 8 times shorter arrays)."""
    best: dict[int, float] = {}
    for w, val in zip(weights.tolist(), values.tolist()):
        if val > 0 and w <= cap:
            best[w] = max(best.get(w, 0.0), val)
    unit = math.gcd(*best) if best else 1
    best = {w // unit: val for w, val in best.items()}
    cap //= unit
    f = np.zeros(cap + 1)
    for w, val in sorted(best.items()):
        rows = -(-(cap + 1) // w)
        pad = np.full(rows * w, -np.inf)
        pad[: cap + 1] = f
        mat = pad.reshape(rows, w)
        i = np.arange(rows, dtype=float)[:, None] * val
        mat = np.maximum.accumulate(mat - i, axis=0) + i
        f = np.maximum(f, mat.reshape(-1)[: cap + 1])
    return f, unit


@dataclass(frozen=True)
class _Cover:
    """What eq. B2's coverage needs of the tables that does not depend on tau (built once per variant bound)."""

    sends: np.ndarray | None  # [n] eq. B2c's least sends per option (None: no blocking sends)
    mixed: np.ndarray  # [n] bool: options on several groups (eq. H1)
    joined: list  # the groups each mixed option joins
    weights: list  # eq. B2b's weightings, [n, G] each
    copies: np.ndarray  # [n] eq. B2g: the most stages of each option the GPUs hold at once (at most p_max)


def _cover(problem: Problem, t: Tables) -> _Cover:
    mixed = t.use.astype(bool).sum(axis=1) > 1
    weights = [t.use / t.use.sum(axis=1, keepdims=True)]  # by GPU share
    if mixed.any():  # and by the share of each group's capacity a stage takes (a group of 0 GPUs: no load)
        load = t.use / np.maximum(np.asarray(problem.group_capacity, float), 1.0)[None, :]
        weights.append(load / load.sum(axis=1, keepdims=True))
    cap = np.asarray(problem.group_capacity, np.int64)[None, :]
    copies = np.where(t.use > 0, cap // np.maximum(t.use, 1), t.p_max).min(axis=1, initial=t.p_max)
    return _Cover(send_floor(problem, t) if problem.p2p_blocking and t.vpp <= 1 else None, mixed,
                  [tuple(np.flatnonzero(t.use[i]).tolist()) for i in np.flatnonzero(mixed)], weights, copies)


def _stage_cap(t: Tables, h: np.ndarray, copies: np.ndarray) -> float:
    """Eq. B2g: at most p_max stages, stage o holding at most h_o layers and option o in at most ``copies[o]`` stages
    at once, hold at most the p_max largest h_o counted ``copies[o]`` times each (only the p_max largest options can
    be among them: each is counted once at least)."""
    k = t.p_max
    if k <= 0 or len(h) == 0:
        return 0.0
    top = np.argpartition(h, -k)[-k:] if len(h) > k else np.arange(len(h))
    top = top[np.argsort(-h[top], kind="stable")]
    n = np.minimum(copies[top], k)
    used = np.minimum(np.cumsum(n), k)  # stages taken up to and including each option
    return float((np.diff(used, prepend=0) * h[top]).sum())


def coverage_at(problem: Problem, t: Tables, tau: float, hmax: np.ndarray, cover: _Cover | None = None,
                ends: tuple | None = None, end_stages: bool = True) -> float:
    """Most layers the GPUs can hold when no stage and no link may take longer than tau (eq. B2).
    Per group an unbounded knapsack of stages (weight num_gpus, value its layer capacity; one
    stage only if the group's own link is slower than tau); the groups of one pipeline form a
    connected set of the graph whose edges are links no slower than tau.

    A mixed option (eq. H1) is an item of each of its groups with its layers split over them by GPU share (eq.
    B2b): value h u_g / sum_g' u_g' in group g. Sound: a plan's stages on group g fit its capacity, so g's
    knapsack is at least their shares, and the shares of a stage add up to its layers. Counting the whole stage
    in every group it touches, as before, let one stage of 8 A100 + 96 V100 hold its layers 4 times over in the
    A100 group's knapsack: Sailor's 32 A100-40GB + 96 V100-16GB row, variant M 32: tau >= 0.0448 s then,
    0.147 s now (its plans: T >= 4.99 s; the optimum 5.03 s). Any weights of a stage's layers over its groups
    that add up to one are sound, so the coverage is the lesser of two: by GPU share, and by the share of each
    group's capacity the stage takes (the group it binds gets most: on gpt3-13b x 3types-4096 variant M 4 the bound
    rises 0.301 -> 0.339 s with it, on Sailor's row the GPU share is the lesser on most variants). Real-valued:
    compare with the layer count less COVER_TOL.

    Under blocking sends (eq. T2b, 1F1B only: the presolve never interleaves a blocking runtime, and eq. I2 has no
    such term) a stage of a pipeline of two or more stages holds only the layers that fit in tau less its least sends
    (eq. B2c, ``send_floor``); a one-stage plan has none, so its stage counts alone.
    Measured on the same row: the optimum's tau 0.0687 s is its slowest stage's 0.0577 s plus 0.011 s of sends,
    which the bound missed (M - 1 = 63 times). Eq. B2l: the last stage of such a pipeline runs the head too, and a
    one-stage plan's stage the embedding and the head (``_layers_at``, ``_with_end``). ``cover``: its tau-independent
    parts (``_cover``), when the caller probes many tau. ``ends``: more per-option caps on a last, a first and a
    one-stage plan's stage (eq. B2k's sync caps with the end stages' own syncs), besides ``hmax`` on every stage;
    ``end_stages``: False leaves eq. B2l out (``variant_bound``'s first pass)."""
    c = cover or _cover(problem, t)
    h0, h, alone, end_layers = _layers_at(t, tau, hmax, c, ends, end_stages)
    cap = _stage_cap(t, h0, c.copies) if USE_STAGE_CAP else math.inf  # (eq. B2g: h before sends, larger)
    half = link_half(t.p2p, t.vpp)
    comps = _components(half, np.flatnonzero(t.use.any(axis=0)).tolist(), tau, c.joined)
    return min(cap, max(alone, min(_split_coverage(problem, t, tau, h, c.mixed, comps, w, half, end_layers)
                                   for w in c.weights)))


def _layers_at(t: Tables, tau: float, hmax: np.ndarray, c: _Cover, ends: tuple | None = None,
               end_stages: bool = True) -> tuple:
    """Per option the most layers a stage holds in tau: alone (h0) and in a pipeline of two stages or more (h: less
    eq. B2c's sends); eq. B2's one-stage plan (``alone``: the most layers of one stage, 0 unless p_min <= 1); and (eq.
    B2l, None when off or p_max < 2) per option the most layers a last and a first stage of such a pipeline hold
    (less their sends and their head's or embedding's time too, in their own memory). Eq. B2l: a one-stage plan's
    stage runs the embedding and the head as well. ``ends``: (last, first, one-stage) caps more (``coverage_at``)."""
    on = USE_END_STAGES and end_stages
    last_cap, first_cap, both_cap = ends if ends is not None else (hmax, hmax, hmax)
    h0 = _layer_caps(t, tau, hmax)
    if t.p_min > 1:
        alone = 0.0
    elif on:  # eq. B2l: tau >= n lambda + first + last time of the one stage, in slot 1's first-stage memory
        alone = float(_one_stage_caps(t, tau, np.minimum(hmax, both_cap)).max(initial=0))
    else:
        alone = float(_layer_caps(t, tau, np.minimum(hmax, both_cap)).max(initial=0))  # a one-stage plan: no send
    h, sends = h0, 0.0
    if c.sends is not None:  # eq. B2c: with two stages or more each stage carries its sends (T2b)
        h, sends = _layer_caps(t, np.maximum(tau - c.sends, 0.0), hmax), c.sends
    if not (on and t.p_max >= 2):
        return h0, h, alone, None
    return h0, h, alone, _end_caps(t, tau - sends, hmax, last_cap, first_cap)


def _end_caps(t: Tables, room, hmax: np.ndarray, last_cap: np.ndarray, first_cap: np.ndarray) -> tuple:
    """Eq. B2l: [n] the most layers a last and a first stage of a pipeline of two stages or more hold within ``room``
    (the period less the stage's sends, s): the last with its head's time in its memory (slot 1, not first), the first
    with its embedding's in first-stage memory (slots 2 .. p_max); ``last_cap``, ``first_cap``: more caps."""
    c = t.coef
    last = _layer_caps(t, room - c["last_time"], np.minimum(np.minimum(hmax, t.U_mem[0]), last_cap))
    first_mem = np.minimum(np.minimum(hmax, t.Uf_mem[1: t.p_max].max(axis=0)), first_cap)
    return last, _layer_caps(t, room - c["first_time"], first_mem)


def _one_stage_caps(t: Tables, tau: float, hmax: np.ndarray) -> np.ndarray:
    """Eq. B2l: [n] the most layers a one-stage plan's stage holds in tau with the embedding and the head, in slot 1's
    first-stage memory (and ``hmax``)."""
    both = np.minimum(hmax, t.Uf_mem[0])
    return _layer_caps(t, tau - t.coef["first_time"] - t.coef["last_time"], both)


def _layer_caps(t: Tables, tau, hmax: np.ndarray) -> np.ndarray:
    """[n] the most layers a stage of each option holds within the stage time ``tau`` (s; a scalar or one per
    option) and in memory (``hmax``): min(hmax, floor(tau / lambda_o)), float noise kept on the larger side."""
    return np.minimum(hmax, np.floor(tau / t.coef["layer_time"] + TIME_RTOL)).astype(np.int64)


def _split_coverage(problem: Problem, t: Tables, tau: float, h: np.ndarray, mixed: np.ndarray, comps: list,
                    weight: np.ndarray, half: np.ndarray, end_layers: tuple | None = None) -> float:
    """Eq. B2's knapsacks with option o's layers h_o counted as h_o * weight[o, g] in each group g it uses (each
    row of ``weight`` adds up to 1 over the option's groups: any such weighting is sound, eq. B2b), the best
    connected component's sum. With ``last`` (eq. B2l: the layers a last and a first stage of each option hold), the
    lesser of two bounds: the best over the last stage's option l of l's own layers plus the knapsacks of every group
    without l's GPUs (``_with_end``), and the same over the first stage's option."""
    per, tables = {}, {}
    for g in sorted({g for comp in comps for g in comp}):
        m = t.use[:, g] > 0
        if half[g, g] > tau and not mixed[m].any():  # eqs. T2, I2: tau >= c / 2 (vpp c / 2) on every link used
            per[g] = float(h[m].max(initial=0))
        else:
            f, unit = _knapsack_table(t.use[m, g], h[m] * weight[m, g], problem.group_capacity[g])
            per[g], tables[g] = float(f[-1]), (f, unit)
    if end_layers is None:
        return max((sum(per[g] for g in comp) for comp in comps), default=0.0)
    return max((min(_with_end(problem, t, comp, per, tables, end) for end in end_layers) for comp in comps),
               default=0.0)


def _with_end(problem: Problem, t: Tables, comp: list, per: dict, tables: dict, end: np.ndarray) -> float:
    """Eq. B2l on one component: a pipeline of two stages or more has a last stage (and a first), of some option l,
    holding at most ``end[l]`` layers (its head's, or its embedding's, time and memory and its sends within tau); its
    other stages fit each group g in cap_g - u_lg GPUs, so g's knapsack at that capacity bounds their shares (eq. B2b),
    and l's shares add up to its layers: the most over l of end[l] + sum_g KS_g(cap_g - u_lg). A group held to one
    stage (its own link slower than tau) keeps its one-stage value (an upper bound whether or not l is on it); -inf
    where no option can be that end stage within tau."""
    on = np.zeros(t.use.shape[1], bool)
    on[comp] = True
    ok = (end >= 1) & ~(t.use[:, ~on] > 0).any(axis=1)
    if not ok.any():
        return -math.inf
    use, total = t.use[ok], end[ok].astype(float)
    for g in comp:
        if g not in tables:
            total = total + per[g]
            continue
        f, unit = tables[g]
        room = problem.group_capacity[g] - use[:, g]
        total = total + np.where(room >= 0, f[np.maximum(room, 0) // unit], -np.inf)
    return float(total.max())


def _components(half: np.ndarray, groups: list[int], tau: float, joined: list[tuple[int, ...]] = ()
                ) -> list[list[int]]:
    """Connected components of the groups under links (either direction) with ``half`` (``link_half``: c / 2, or
    vpp c / 2 interleaved) <= tau, and groups ``joined`` by one mixed option (one stage on both, eq. H1)."""
    left, out = set(groups), []
    while left:
        stack, comp = [min(left)], []
        left.discard(stack[0])
        while stack:
            g = stack.pop()
            comp.append(g)
            for h in sorted(left):
                if min(half[g, h], half[h, g]) <= tau or any(g in j and h in j for j in joined):
                    left.discard(h)
                    stack.append(h)
        out.append(comp)
    return out


# root_setup's memo: id(variant) -> [a weak reference to the variant, the problem's other fields, tables, bound]; an
# entry leaves with its variant. Keyed by the variant object, not the problem: the planner gives each method its own
# Problem (``planner._restrict``: the same option, group and variant objects, the variants kept renumbered)
_ROOTS: dict[int, list] = {}


def _others(problem: Problem) -> tuple:
    return tuple(getattr(problem, f.name) for f in dataclasses.fields(problem) if f.name != "variants")


def _memo(problem: Problem, v: int) -> list | None:
    var = problem.variants[v]
    e = _ROOTS.get(id(var))
    if e is None or e[0]() is not var or any(a is not b for a, b in zip(e[1], _others(problem))):
        return None
    return e


def root_setup(problem: Problem, v: int, bound: VariantBound | None = None) -> tuple[Tables, VariantBound]:
    """Variant v's slot tables without a tau cap (``build_tables(problem, v)``) and their eq. B2 bound, made once per
    variant of a problem: the DP heuristic's variant loop and the exact search's set-up (``_variant_tables``) both need
    every variant's, one after the other in one process (measured: qwen3-235b-a22b x hetero3-1024, 54 variants, 0.61 s
    of the DP's time and 0.52 s of the search's set-up). The tables are shared, so read-only to every caller (a node
    builds its own); under another index of the same variant (a restricted problem) a shallow copy carries the index.
    ``bound``: v's bound as computed elsewhere (a forked child's), taken instead of computing it again."""
    e = _memo(problem, v) or root_seed(problem, v, bound)
    if e[2] is None:
        e[2] = build_tables(problem, v)
    if e[3] is None:
        e[3] = variant_bound(problem, e[2])
    t = e[2]
    return (t if t.v == v else dataclasses.replace(t, v=v)), e[3]


def root_seed(problem: Problem, v: int, bound: VariantBound | None) -> list:
    """``root_setup``'s entry for variant v, made empty (tables built on first use) with ``bound`` when given and v has
    none yet (a forked child's bound: the DP's look-ahead, eq. PAR5b)."""
    e = _memo(problem, v)
    if e is None:
        var = problem.variants[v]
        key = id(var)
        e = _ROOTS[key] = [weakref.ref(var, lambda _, k=key: _ROOTS.pop(k, None)), _others(problem), None, None]
    if e[3] is None:
        e[3] = bound
    return e


def root_known(problem: Problem, v: int) -> bool:
    """Whether ``root_setup`` holds variant v's bound for this problem (or one that differs only in its variants)."""
    e = _memo(problem, v)
    return e is not None and e[3] is not None


def variant_bound(problem: Problem, t: Tables) -> VariantBound:
    """Eq. B2: the smallest candidate stage time tau at which the GPUs can hold L layers, and the
    fill/sync/p2p terms every plan pays. Valid for every plan of the variant (memory bounds only)."""
    if t.n == 0:
        return VariantBound(math.inf, math.inf, math.inf, "no option is allowed and fits its GPU group")
    if t.p_min == 0:
        return VariantBound(math.inf, math.inf, math.inf, _coverage_reason(problem, t))
    hmax = memory_layers(t)
    lt = t.coef["layer_time"]
    stage = (np.arange(1, t.L + 1)[None, :] * lt[:, None])[np.arange(t.L)[None, :] < hmax[:, None]]
    cover = _cover(problem, t)
    steps = [stage, link_half(t.p2p, t.vpp).ravel()]  # coverage changes only here (eq. B2) ...
    if cover.sends is not None:  # ... and where a stage's layers plus its least sends fill tau (B2c)
        with_sends = np.arange(1, t.L + 1)[None, :] * lt[:, None] + cover.sends[:, None]
        steps.append(with_sends[np.arange(t.L)[None, :] < hmax[:, None]])
    cand, need = np.unique(np.concatenate(steps)), t.L - COVER_TOL

    def covered(tau: float, ends: bool) -> bool:
        return coverage_at(problem, t, tau, hmax, cover, end_stages=ends) >= need

    if not covered(float(cand[-1]) if len(cand) else 0.0, False):
        cap = math.floor(coverage_at(problem, t, math.inf, hmax, cover, end_stages=False) + COVER_TOL)
        return VariantBound(math.inf, math.inf, math.inf,
                            f"the GPUs can hold at most {cap} of the {t.L} layers in memory")
    lo_i = _least_covered(cand, lambda tau: covered(tau, False))
    tau_lb = float(cand[lo_i])
    if USE_JOINT_COVER and joint_cover.usable(t.use):  # eq. B2h: the groups' GPUs counted once, in one LP
        lp = joint_cover.JointCover(problem, t.use, cover.copies, t.p_max)
        # (its probe leaves eq. B2l out: the ladder's steps are eq. B2's, and a one-stage plan's extras would add more)
        tau_lb = joint_cover.lifted_tau(lp, need, lambda tau: _layers_at(t, tau, hmax, cover, end_stages=False)[1:3],
                                        cand[lo_i:])
        if not math.isfinite(tau_lb):
            return VariantBound(math.inf, math.inf, math.inf, "the GPUs cannot hold all "
                                f"{t.L} layers in memory at once (eq. B2h: each GPU counted once over its stages)")
    if USE_END_STAGES and not covered(tau_lb, True):  # eq. B2l lifts it further: from there, with its own steps
        cand = _end_steps(t, cand, int(np.searchsorted(cand, tau_lb)), hmax, cover)
        if not covered(float(cand[-1]), True):
            cap = math.floor(coverage_at(problem, t, math.inf, hmax, cover) + COVER_TOL)
            return VariantBound(math.inf, math.inf, math.inf, f"the GPUs can hold at most {cap} of the {t.L} layers "
                                "in memory with the embedding on the first stage and the head on the last (eq. B2l)")
        tau_lb = float(cand[_least_covered(cand, lambda tau: covered(tau, True))])
    tau_lb = max(tau_lb, _budget_tau(problem, t))
    rest = _rest_bound(problem, t)
    return VariantBound(tau_lb, rest, t.tau_weight * tau_lb + rest)


def _least_covered(cand: np.ndarray, covered) -> int:
    """The index of the smallest candidate tau that ``covered`` (monotone in tau, true at the last) holds."""
    lo_i, hi_i = 0, len(cand) - 1
    while lo_i < hi_i:
        mid = (lo_i + hi_i) // 2
        if covered(float(cand[mid])):
            hi_i = mid
        else:
            lo_i = mid + 1
    return lo_i


def _end_steps(t: Tables, cand: np.ndarray, lo_i: int, hmax: np.ndarray, cover: _Cover) -> np.ndarray:
    """Eq. B2l's candidate tau from ``cand[lo_i]`` up (eqs. B2 and B2h's answer: B2l's coverage is no larger than B2's,
    and both bounds hold, so the answer lies there): eq. B2's own steps and where a last or a first stage's layers,
    sends and head or embedding time, or a one-stage plan's layers, embedding and head, fill tau."""
    c, lt = t.coef, t.coef["layer_time"]
    sends = cover.sends if cover.sends is not None else 0.0
    n = np.arange(1, t.L + 1)[None, :]
    steps = [cand[lo_i:]] + [(n * lt[:, None] + extra[:, None])[np.arange(t.L)[None, :] < hmax[:, None]]
                             for extra in (c["last_time"] + sends, c["first_time"] + sends,
                                           c["first_time"] + c["last_time"])]
    out = np.unique(np.concatenate(steps))
    return out[out >= cand[lo_i]]


def signature_bounds(problem: Problem, t: Tables) -> dict[int, VariantBound]:
    """Eq. B2 per uniform signature (eq. U1): {signature id: the bound on the tables of its options alone}, each a
    bound on every plan of the variant that uses that signature only (eqs. U1c, DP8i)."""
    return {int(s): variant_bound(problem, subset(t, t.sig == s)) for s in np.unique(t.sig)}


def _budget_tau(problem: Problem, t: Tables) -> float:
    """Eq. C2 as a bound on tau under a budget (eq. W1): sum_j w_j t_j <= B tau, and every plan has
    sum_j w_j t_j >= L min_o w_o lt_o + min_o w_o ft_o + min_o w_o xt_o (0 without a budget)."""
    b = problem.budget
    if b is None or b.limit <= 0 or t.n == 0:
        return 0.0
    w, c = np.asarray(b.weight, float)[t.opts], t.coef
    return float((t.L * (w * c["layer_time"]).min() + (w * c["first_time"]).min() + (w * c["last_time"]).min())
                 / b.limit)


def capped_bound(problem: Problem, t: Tables, vb: VariantBound, cutoff: float) -> VariantBound:
    """Eq. B2i: ``vb`` (eq. B2's bound of the variant of ``t``) with its rest term under the period cap of ``cutoff``:
    a plan of the variant below the cut-off has tau <= cap = (cut-off - rest_lb) / (M - 1/vpp) (eq. X1), so its stages
    hold at most cap / lambda_o layers each, and eq. B2e's fill LP under that cap (``capped_rest``) bounds its rest
    term. The bound returned holds for every plan below the cut-off (those above it need none): a variant whose
    total_s reaches the cut-off has no plan below it. Measured on llama3-70b x hetero3-4096 (gbs 2048; optimum
    3.816 s, variant M 32 x vpp 4 x 16 stages): of the 23 variants whose eq. B2 bound lay below the optimum's
    cut-off, 15 close; the optimum's own 3.593 -> 3.735 s (~2 ms an LP on 583 options)."""
    W = t.tau_weight
    if W <= 0 or not math.isfinite(vb.total_s) or not math.isfinite(cutoff):
        return vb
    rest = capped_rest(problem, t, (cutoff - vb.rest_lb) / W)
    if rest is None or rest <= vb.rest_lb:
        return vb
    return VariantBound(vb.tau_lb, rest, max(vb.total_s, W * vb.tau_lb + rest))


def capped_rest(problem: Problem, t: Tables, cap: float) -> float | None:
    """Eq. B2i: the rest term of eq. B2 with eq. B2e's fill LP under the period cap ``cap`` (``fill_lp.capped_fill``):
    at most T - (M - 1/vpp) tau (M - 1 plain) for every plan of the variant with tau <= cap; +inf where no plan has
    tau <= cap; None where it does not apply (eq. B2e off, an interleaved copy without its stage count, no option)
    or HiGHS gives no answer. Eq. B2j lifts its sync term where a GPU group is needed within the cap, eq. B2k by the
    largest sync a plan within the cap needs."""
    if not (USE_FILL_LP and (t.num_stages or t.vpp == 1) and t.n and t.p_min > 0):
        return None
    h = np.maximum(_layer_caps(t, cap, memory_layers(t)), 0)  # (cap < 0: no layer)
    body = capped_fill(problem, t, h)
    if body is None or math.isinf(body):
        return body
    return _rest_bound(problem, t, body, h, cap)


def _forced_sync(problem: Problem, t: Tables, h: np.ndarray, fill: float, sync: float) -> float:
    """Eq. B2j: a lower bound on sigma + sum_j t_j / vpp - fill / vpp (seconds) where every plan within the layer caps
    ``h`` must use a GPU group g (eq. B2i's LP without g's options has no point). Such a plan has a stage j on g, and
    eq. T3 (I1) gives sigma >= s_j - beta sum_{k<j} t_k >= s_j - beta (sum t - t_j), so

        sigma + sum t / vpp >= (1/vpp - beta) sum t + s_j + beta t_j >= (1/vpp - beta) fill + min_{o on g} (s_o + beta lambda_o)

    with s_o + beta lambda_o the sync and time of a one-layer stage of o (beta = BWD_SHARE/vpp interleaved,
    sync_share plain: 1/vpp - beta >= 0; every sync and time term >= 0). Returned minus fill / vpp, so that it adds
    to the rest term as eq. T3's sync does; ``sync`` (eq. T3's) where no group lifts it. The groups whose term would
    lift it are tried dearest first, one LP each (~2 ms); the first needed one is the answer."""
    beta = sigma_share(t.vpp, problem.p2p_blocking)
    if beta > 1 / t.vpp:  # (never: BWD_SHARE < 1; the step from sum t to fill needs 1/vpp - beta >= 0)
        return sync
    c = t.coef
    one = c["sync_fixed"] + c["sync_per_layer"] + beta * c["layer_time"]  # [n] a one-layer stage's s + beta t
    base = -beta * fill  # (1/vpp - beta) fill - fill / vpp
    terms = [(base + float(one[on].min()), g) for g in range(t.use.shape[1])
             for on in [(t.use[:, g] > 0) & (h > 0)] if on.any()]
    for value, g in sorted((x for x in terms if x[0] > sync), reverse=True):
        without = np.where(t.use[:, g] > 0, 0, h)
        if capped_fill(problem, t, without) == math.inf:  # (None: HiGHS gave no answer, so nothing is known)
            return value
    return sync


def _sync_floor(problem: Problem, t: Tables, cap: float, h: np.ndarray, fill: float, sync: float
                ) -> tuple[float, float]:
    """Eq. B2k: (a lower bound on sigma + sum_j t_j - fill (seconds), S_lb) for every plan of a plain variant (vpp 1)
    whose period is at most ``cap`` (``h``: eq. B2i's layer caps there). Let S = max_j s_j (eq. T1c) be such a plan's
    largest sync. Its stage j of option o holds n_j layers with s_o^0 + n_j s_o^1 <= s_j <= S (and, under eq. B2l and
    SYNC_FLOOR_ENDS, a last stage with its head's sync s_o^l added, a first its embedding's s_o^f, a one-stage plan
    both), and n_j <= cap / lambda_o (eq. T2), so eq. B2's coverage at tau = cap with every option's layers capped at
    k_o(S) = floor((S - s_o^0) / s_o^1) holds all L layers; coverage grows with S, so S > S_lb, the largest S found by
    bisection at which it does not (the bisection keeps an S not covered as its lower end). Eq. T3's row of that stage
    gives sigma >= S - beta sum_{k<j} t_k >= S - beta sum t, so

        sigma + sum t >= (1 - beta) sum t + S >= (1 - beta) fill + S_lb,

    returned minus fill (it adds to the rest term as eq. T3's sync does); ``sync`` where that is no larger; and S_lb, a
    floor on S (0 where the bisection does not run: eq. B2n takes it). Why: the rest term's sync is a one-layer first
    stage's, while a plan within a period cap needs stages of many layers on the GPUs it has, and under a blocking
    runtime (beta = 0, DeepSpeed) nothing hides their sync: Sailor's 32 A100 + 96 V100 row (OPT-350M, fp32, dp 16)
    syncs 0.38 s against the 0.11 s one-layer bound. Tried only where S_lb could lift it (the largest sync within the
    caps, less beta fill, above ``sync``); SYNC_FLOOR_STEPS coverages."""
    if t.vpp > 1 or not (cap > 0 and math.isfinite(cap)):
        return sync, 0.0
    beta = sigma_share(t.vpp, problem.p2p_blocking)
    c = t.coef
    s0, s1 = c["sync_fixed"], c["sync_per_layer"]
    hmax = memory_layers(t)
    on = h > 0
    if not on.any():
        return sync, 0.0
    ends = c["sync_first"] + c["sync_last"] if SYNC_FLOOR_ENDS and USE_END_STAGES else 0.0
    hi = float((s0 + h * s1 + ends)[on].max())  # at this S no option's sync caps it below its period cap
    if hi - beta * fill <= sync:
        return sync, 0.0
    cover, need = _cover(problem, t), t.L - COVER_TOL
    per = np.where(s1 > 0, s1, 1.0)

    def within(S: float, fixed: np.ndarray) -> np.ndarray:  # [n] the most layers whose sync fits S
        k = np.where(s1 > 0, np.floor((S - fixed) / per + TIME_RTOL), np.where(fixed <= S, t.L, -1))
        return np.maximum(k, 0).astype(np.int64)

    def covers(S: float) -> bool:  # (eq. B2l's end stages with their own syncs: the head's and the embedding's)
        ends = (within(S, s0 + c["sync_last"]), within(S, s0 + c["sync_first"]),
                within(S, s0 + c["sync_first"] + c["sync_last"])) if SYNC_FLOOR_ENDS else None
        return coverage_at(problem, t, cap, np.minimum(hmax, within(S, s0)), cover, ends) >= need

    lo = max(sync + beta * fill, 0.0)  # (below it the term cannot lift the sync)
    if covers(lo):
        return sync, 0.0
    for _ in range(SYNC_FLOOR_STEPS):
        mid = (lo + hi) / 2
        if covers(mid):
            hi = mid
        else:
            lo = mid
    return max(sync, lo - beta * fill), lo


def _rest_bound(problem: Problem, t: Tables, body: float | None = None, caps: np.ndarray | None = None,
                cap: float | None = None) -> float:
    """sum t_j >= L*min lt + min ft + min xt (on a fixed stage count, eq. B2e's LP in place of L*min lt; ``body``:
    that LP's value given, eq. B2i); sum c_j >= (p_min-1)*min p2p; sigma >= the sync of a first stage with one layer
    (eqs. B2, T3), or eq. B2j's where ``caps`` (eq. B2i's layer caps under the period cap ``cap``) make a group
    needed, or eq. B2k's; interleaved, eq. I1: sum t / vpp + vpp * sum c (+ the wrap, >= 0)."""
    c = t.coef
    fill = t.L * c["layer_time"].min() + c["first_time"].min() + c["last_time"].min()
    if body is None and USE_FILL_LP and t.vpp > 1 and t.num_stages:  # eq. B2e: P stages of a layer at least share
        body = fixed_count_fill(problem, t)  # the GPUs (fill_lp)
    if body is not None:
        fill = max(fill, body + c["first_time"].min() + c["last_time"].min())
    groups = np.unique(t.group)
    least_link = float(t.p2p[np.ix_(groups, groups)].min())
    p2p_min = least_link if t.p_min > 1 else 0.0
    # eq. T3: sigma >= s_0, the first stage's sync (at least one layer and the embedding); sigma_v >= s_0 still
    sync = float((c["sync_fixed"] + c["sync_per_layer"] + c["sync_first"]).min())
    if caps is not None and USE_FORCED_SYNC:
        sync = max(sync, _forced_sync(problem, t, caps, float(fill), sync))
    floor = 0.0  # (eq. B2k's floor on a plan's largest sync)
    if caps is not None and cap is not None and USE_SYNC_FLOOR:
        term, floor = _sync_floor(problem, t, cap, caps, float(fill), sync)
        sync = max(sync, term)
    rest = float(fill / t.vpp + (t.p_min - 1) * p2p_min * t.vpp + sync)
    if caps is not None and cap is not None and USE_JOINT_REST and t.vpp == 1:
        rest = max(rest, _joint_rest(problem, t, caps, cap, floor, least_link if t.p_max > 1 else 0.0))
    return rest + _extra_bound(problem, t)


def _joint_rest(problem: Problem, t: Tables, caps: np.ndarray, cap: float, floor: float, p2p: float) -> float:
    """Eq. B2n (``rest_dp``) on a plain variant within the period cap ``cap`` (``caps``: eq. B2i's layer caps there;
    ``floor``: eq. B2k's S_lb; ``p2p``: the least link time), or 0 where its table is too large. A stage's layers as
    eq. B2l counts them (``_end_caps``, ``_one_stage_caps``): in a pipeline of two or more stages within the cap less
    its least sends under blocking sends (eq. B2c), the first's less the embedding's time in first-stage memory, the
    last's less the head's in its memory; alone, less both."""
    hmax = memory_layers(t)
    sends = send_floor(problem, t) if problem.p2p_blocking else 0.0  # (eq. B2c; vpp 1 here)
    room = np.maximum(cap - sends, 0.0)
    last, first = _end_caps(t, room, hmax, caps, caps) if t.p_max >= 2 else (caps, caps)  # (unused below 2 stages)
    got = rest_dp.joint_rest(t, problem.group_capacity, {
        "mid": np.minimum(caps, _layer_caps(t, room, hmax)), "first": first, "last": last,
        "one": np.minimum(caps, _one_stage_caps(t, cap, caps)),
    }, sigma_share(1, problem.p2p_blocking), p2p, floor)
    return 0.0 if got is None else got


def _extra_bound(problem: Problem, t: Tables) -> float:
    """Eq. EX1's terms are at least L min per_layer + min first + min last over the usable options (their
    per-stage part with the constant is >= 0 on every feasible plan, ``problem.ExtraObjective``); 0 without."""
    x = problem.variants[t.v].extra
    if x is None or t.n == 0:
        return 0.0
    o = t.opts
    return float(t.L * x.per_layer[o].min() + x.first[o].min() + x.last[o].min())


def _coverage_reason(problem: Problem, t: Tables) -> str:
    best_nf = t.U_mem.max(axis=1)
    best_f = t.Uf_mem.max(axis=1)
    K = t.K
    if best_f.max() < 1:
        return "no option can hold one layer plus the embedding as the first stage"
    most = max(int(best_nf[: p - 1].sum() + best_f[p - 1]) for p in range(1, K + 1))
    return (f"no option can hold the {t.L} layers within {K} stages "
            f"(memory allows at most {most} layers at micro-batch size {problem.variants[t.v].samples_per_microbatch})")


def infeasibility_reason(problem: Problem, bounds: list[VariantBound]) -> str:
    """The binding reason when every variant is infeasible (for RawResult.message)."""
    if not problem.variants:
        return "no micro-batch variant to plan with"
    reasons = sorted({b.reason for b in bounds if b.reason})
    if reasons:
        return "; ".join(reasons)
    extra = []
    if problem.uniform:
        extra.append("one (tp, dp, recompute) for every stage")
    if problem.same_tp_first_last:
        extra.append("the same tp on the first and last stage")
    rules = (" under " + " and ".join(extra)) if extra else ""
    return f"no plan satisfies memory, GPU counts and stage limits together{rules}"
