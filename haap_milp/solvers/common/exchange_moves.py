"""Eq. LS1f of formulations/dp.md: the local search's stage-count-preserving move, one stage split in two and two
stages of one group merged into one, in a single candidate.

An interleaved copy fixes its stage count (eq. I5), so eq. LS1's split and merge, each of which changes it, are not
plans of that variant, and neither is either half of this move on its own. Each half keeps its GPUs: the split's two
stages use at most the split stage's GPUs of its group (plus the group's idle ones), the merged stage at most the
two merged stages' (plus idle), so the halves meet only in the layer count (``d``: layers the split stage gains,
the merged pair loses) and in the capacity of a group both touch (checked exactly here, memory by ``violations``).

Measured: gpt3-13b x hetero3-4096 (gbs 1024, the CLI's space), the 10 s search's incumbent 0.48279 s (interleaved,
M 16, vpp 4, P 16; a local optimum of eq. LS1's other moves) -> 0.47831 s by one such candidate (the first
stage's 128 H100 split into two stages of 64, one layer more; two A100-80GB stages of 256 GPUs and 2 layers merged
into one of 512 and 3 layers); the proven optimum is 0.47781 s.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np

from haap_milp.pipeline import BWD_SHARE, exposed_sync, interleaved_tau_weight, stage_memory, sync_share
from haap_milp.problem import Assignment, Problem, Stage, stage_sum, stage_times, sync_times

# candidates per call, best first by ``_score``. Measured on the instance above: 56 merges and 834 splits on the fronts
# within the cap, 55 and 151 kept, 719 pairs scored, the improving candidate ranked first
EXCHANGE_TOP = 64
# halves kept by their own key (``_Base.split_key``, ``merge_key``: what each alone adds to T) before they are combined: the merges per layer
# shift d, the splits per stage, d and whether they need GPUs a merge frees (such a split ranks well alone, its merge
# pays for it: ranked together they crowd out the splits within the stage's own GPUs)
MERGES_KEPT = 48
SPLITS_KEPT = 4
# split pairs enumerated per call, about (a cut of the fronts past it). Measured: 137-15,138 on the catalog instances
# above (qwen3-235b-a22b x hetero3-4096 the most), 227,598 on a synthetic 32-stage plan of 3-layer stages with every
# group's GPUs mostly free and memory no limit (48 options a front), 1.3 s a call before the cut
SPLIT_PAIRS = 40_000
MERGE_OPTIONS = 20_000  # likewise the merged stages' options over all pairs (603 on the catalog instances above at most)
EXCHANGE_SCORED = 2000  # pairs scored (by ``_score``, ~20 us each), those of lowest summed keys first
LAYER_SHIFTS = (-1, 0, 1)  # d


def exchange_moves(problem: Problem, a: Assignment, best: float):
    """Candidates of eq. LS1f whose score is below ``best`` (a lower bound on T without links, so none above it can
    beat ``best``; under eq. EX1's terms no filter), at most EXCHANGE_TOP, lowest score first; none on a plan of
    fewer than three stages. Mixed-type stages (eq. H1) are neither split nor merged."""
    v = problem.variants[a.variant]
    if len(a.stages) < 3 or v.cost_lists is None:
        return
    limit = best if v.extra is None else float("inf")
    front = _Fronts(problem, a.variant, max(stage_times(problem, a)))  # no new stage slower than the slowest
    used = Counter()
    for s in a.stages:
        used.update(dict(problem.options[s.option].usage))
    free = {g: problem.group_capacity[g] - used[g] for g in range(len(problem.groups))}
    base = _Base(problem, a)
    merges = _best(_merges(problem, a, front, free, base), MERGES_KEPT, lambda h: h[0][2])  # per d
    spare = Counter()  # per group, the most GPUs a kept merge there frees
    for _, _, g, dg, _ in merges:
        spare[g] = max(spare[g], -dg)
    # per (j, d, whether the split needs GPUs a merge frees)
    splits = _best(_splits(problem, a, front, free, spare, base), SPLITS_KEPT, lambda h: (*h[0][:2], h[3] > free[h[2]]))
    # combos within a cheaper bound (the untouched stages' layer times alone: their embedding or head may move), by the
    # sum of their halves' keys, the EXCHANGE_SCORED lowest scored
    core = [s.num_layers * v.cost_lists[0][s.option] for s in a.stages]
    top = _top(core)
    w, vpp, total, combos = base.w, base.vpp, sum(core), []
    for (j, d, pair), ts, gs, ds, key_s in splits:
        for (k, m, d2, z), tz, gm, dm, key_m in merges:
            if d2 != d or j in (k, m) or (ds + dm > free[gs] if gs == gm else ds > free[gs] or dm > free[gm]):
                continue  # (eq. G1 on the groups the two halves change)
            rest_max = _max_without(core, top, (j, k, m))
            lb = w * max(rest_max, *ts, tz) + (total - core[j] - core[k] - core[m] + sum(ts) + tz) / vpp
            if lb < limit:
                combos.append((key_s + key_m, len(combos), (j, pair, k, m, z)))
    combos.sort(key=lambda c: c[:2])
    scored, seen = [], {a.stages}
    for _, _, parts in combos[:EXCHANGE_SCORED]:
        c = _compose(a, *parts)
        if c.stages in seen:  # (equal stages give the same candidate from several combos)
            continue
        seen.add(c.stages)
        score = _score(problem, c)
        if score < limit:
            scored.append((score, len(scored), c))
    scored.sort(key=lambda s: s[:2])
    for _, _, c in scored[:EXCHANGE_TOP]:
        yield c


def _best(halves, per: int, by) -> list:
    """Per ``by(half)``, the ``per`` halves of lowest key (ties: in the order given)."""
    groups = defaultdict(list)
    for i, h in enumerate(halves):
        groups[by(h)].append((h[-1], i, h))
    return [h for g in sorted(groups) for _, _, h in sorted(groups[g])[:per]]


class _Base:
    """The plan's stage times t_j, its sigma terms s_j - beta sum_{k<j} t_k (eq. T3; ``_bound``'s weights) and their
    prefix and suffix maxima, for the halves' keys in O(1) each."""

    def __init__(self, problem: Problem, a: Assignment):
        self.w, self.vpp, self.beta = self.weights = _weights(problem, a.variant)
        self.t, s = stage_times(problem, a), sync_times(problem, a)
        p = len(self.t)
        self.pre = [0.0] * p  # sum of the times before stage j
        for j in range(1, p):
            self.pre[j] = self.pre[j - 1] + self.t[j - 1]
        self.term = [s[j] - self.beta * self.pre[j] for j in range(p)]
        self.before, self.after = [-math.inf] * p, [-math.inf] * p  # max term over i < j, over i > j
        for j in range(1, p):
            self.before[j] = max(self.before[j - 1], self.term[j - 1])
            self.after[p - 1 - j] = max(self.after[p - j], self.term[p - j])
        self.top = _top(self.t)
        self.tau, self.sigma, self.total = max(self.t), max(self.term), sum(self.t)

    def _gain(self, gone: tuple, times: tuple, sigma: float) -> float:
        tau = max(_max_without(self.t, self.top, gone), *times)
        added = sum(times) - sum(self.t[i] for i in gone)
        return self.w * (tau - self.tau) + added / self.vpp + sigma - self.sigma

    def split_key(self, j: int, tx: float, ty: float, sx: float, sy: float) -> float:
        """What ``_bound`` gains when stage j becomes x then y (times t, syncs s), the other stages as they are: the
        later stages' sigma terms move with the time before them (a split early in the pipeline lowers the exposure of
        every later stage's sync)."""
        b, pre, added = self.beta, self.pre[j], tx + ty - self.t[j]
        sigma = max(self.before[j], sx - b * pre, sy - b * (pre + tx), self.after[j] - b * added)
        return self._gain((j,), (tx, ty), sigma)

    def merge_key(self, k: int, m: int, tz: float, sz: float, between: float) -> float:
        """The same when stages k < m become z at k; ``between``: the largest sigma term of the stages between them."""
        b, at_k = self.beta, tz - self.t[k]
        sigma = max(self.before[k], sz - b * self.pre[k], between - b * at_k, self.after[m] - b * (at_k - self.t[m]))
        return self._gain((k, m), (tz,), sigma)


def _top(x: list) -> list:
    return sorted(range(len(x)), key=lambda i: -x[i])[:4]


def _max_without(x: list, top: list, gone: tuple, empty: float = 0.0) -> float:
    """max of ``x`` without the indices ``gone`` (at most three), from ``top``, its four largest."""
    return next((x[i] for i in top if i not in gone), empty)


class _Fronts:
    """Per (group, layers, first, last): the allowed single-group options no slower than ``cap`` there that no other
    such option dominates in GPUs, time, sync and memory (static and per in-flight micro-batch, as fractions of the
    GPU's usable memory), as (option, GPUs, time, sync) by GPUs. A heuristic cut, nearly exact: a dominated option is
    no better for its own stage (time, sync, memory) and helps only by being slower, which lowers the later stages'
    exposed sync (eq. T3's offsets) by beta times the difference. It keeps the enumeration small (MoE problems have
    some hundred options a group)."""

    def __init__(self, problem: Problem, variant: int, cap: float):
        v = self.v = problem.variants[variant]
        self.cap, self.lists, self.cache = cap, v.cost_lists, {}
        self.opts, self.gpus = defaultdict(list), {}  # group -> allowed single-group options; their GPUs
        for o in np.flatnonzero(v.allowed).tolist():
            if not problem.options[o].mix:
                self.opts[problem.options[o].group].append(o)
                self.gpus[o] = problem.options[o].num_gpus

    def __call__(self, g: int, n: int, first: bool, last: bool) -> list:
        key = (g, n, first, last)
        if key not in self.cache:
            self.cache[key] = self._build(g, n, first, last)
        return self.cache[key]

    def _build(self, g: int, n: int, first: bool, last: bool) -> list:
        v, (lt, ft, la, sf, sl, s1, s2) = self.v, self.lists
        rows = []
        for o in self.opts[g]:
            t = stage_sum(o, n, first, last, lt, ft, la)
            if t > self.cap:
                continue
            s = stage_sum(o, n, first, last, sl, s1, s2, sf)
            ends = ((v.first_static_mem[o], v.first_act_mem[o]) if first else None,
                    (v.last_static_mem[o], v.last_act_mem[o]) if last else None)
            static = stage_memory(v.fixed_mem[o], v.layer_static_mem[o], v.layer_act_mem[o], n, 0, *ends)
            act = stage_memory(v.fixed_mem[o], v.layer_static_mem[o], v.layer_act_mem[o], n, 1, *ends) - static
            cap = float(v.mem_capacity[o])
            rows.append((self.gpus[o], t, s, float(static) / cap, float(act) / cap, o))
        rows.sort()
        kept = []
        for r in rows:
            if not any(all(k[i] <= r[i] for i in range(5)) for k in kept):
                kept.append(r)
        return [(r[5], r[0], r[1], r[2]) for r in kept]


def _splits(problem: Problem, a: Assignment, front, free, spare, base: _Base):
    """Halves ((j, d, (x, y)), (t_x, t_y), group, GPUs added, key): stage j replaced by x then y of its group with
    n_x + n_y = n_j + d, each on the front of its place (``_Fronts``), on at most stage j's GPUs plus the group's free
    ones and the most a merge there frees; an inner stage's halves in one order (eq. LS1d reorders). Key:
    ``_Base.split_key``. At most about SPLIT_PAIRS pairs: past that every front is cut to its options of least
    time plus sync, alike for every stage."""
    p, opt = len(a.stages), problem.options
    places = []  # (j, d, n1, x's front, y's front)
    for j, st in enumerate(a.stages):
        if not opt[st.option].mix:
            g = opt[st.option].group
            for d in LAYER_SHIFTS:
                n = st.num_layers + d
                places += [(j, d, n1, front(g, n1, j == 0, False), front(g, n - n1, False, j == p - 1))
                           for n1 in range(1, n)]
    pairs = sum(len(xs) * len(ys) for *_, xs, ys in places)
    keep = max(4, math.isqrt(SPLIT_PAIRS // max(1, len(places)))) if pairs > SPLIT_PAIRS else None
    for j, d, n1, xs, ys in places:
        st = a.stages[j]
        g, have, n = opt[st.option].group, opt[st.option].num_gpus, st.num_layers + d
        if keep is not None:
            xs, ys = _least(xs, keep), _least(ys, keep)
        for x, gx, tx, sx in xs:
            for y, gy, ty, sy in ys:
                if gx + gy <= have + free[g] + spare[g] and (not 0 < j < p - 1 or (n1, x) <= (n - n1, y)):
                    yield ((j, d, (Stage(x, n1), Stage(y, n - n1))), (tx, ty), g, gx + gy - have,
                           base.split_key(j, tx, ty, sx, sy))


def _least(entries: list, k: int) -> list:
    """The ``k`` front entries of least time plus sync (ties: by GPUs, the front's order)."""
    return sorted(entries, key=lambda e: e[2] + e[3])[:k]


def _merges(problem: Problem, a: Assignment, front, free, base: _Base):
    """Halves ((k, m, d, z), t_z, group, GPUs added, key): stages k < m of one group replaced by z at k with
    n_k + n_m - d layers, z on the front of its place (``_Fronts``; never last: stage m's successor or the split's
    second stage ends the pipeline when m was last), on at most their GPUs plus the group's free ones. Key:
    ``_Base.merge_key``. At most about MERGE_OPTIONS options over all pairs, as in ``_splits``."""
    p, opt = len(a.stages), problem.options
    places = []  # (k, m, d, n, z's front, the largest sigma term between k and m)
    for k, sk in enumerate(a.stages):
        between = -math.inf
        for m in range(k + 1, p):
            if m > k + 1:
                between = max(between, base.term[m - 1])
            sm, g = a.stages[m], opt[sk.option].group
            if opt[sk.option].mix or opt[sm.option].mix or opt[sm.option].group != g:
                continue
            for d in LAYER_SHIFTS:
                n = sk.num_layers + sm.num_layers - d
                if n >= 1:
                    places.append((k, m, d, n, front(g, n, k == 0, False), between))
    total = sum(len(zs) for *_, zs, _ in places)
    keep = max(4, MERGE_OPTIONS // max(1, len(places))) if total > MERGE_OPTIONS else None
    for k, m, d, n, zs, between in places:
        g = opt[a.stages[k].option].group
        have = opt[a.stages[k].option].num_gpus + opt[a.stages[m].option].num_gpus
        for z, gz, tz, sz in (zs if keep is None else _least(zs, keep)):
            if gz <= have + free[g]:
                yield (k, m, d, Stage(z, n)), tz, g, gz - have, base.merge_key(k, m, tz, sz, between)


def _compose(a: Assignment, j: int, pair, k: int, m: int, z: Stage) -> Assignment:
    out = []
    for i, s in enumerate(a.stages):
        if i == j:
            out.extend(pair)
        elif i == k:
            out.append(z)
        elif i != m:
            out.append(s)
    return Assignment(a.variant, tuple(out))


def _weights(problem: Problem, variant: int) -> tuple:
    """(w, vpp, beta) of ``_bound``: eq. T1's M - 1, 1 and eq. T3's beta; interleaved eq. I1's M - 1/vpp, vpp and
    BWD_SHARE / vpp (``pipeline.iteration_time``'s)."""
    v = problem.variants[variant]
    if v.vpp > 1:
        return interleaved_tau_weight(v.num_microbatches, v.vpp), v.vpp, BWD_SHARE / v.vpp
    return v.num_microbatches - 1, 1, sync_share(problem.p2p_blocking)


def _bound(t: list, s: list, w: float, vpp: int, beta: float) -> float:
    """T of eq. T1 / I1 without its links and with tau at its floor max t: w max t + sum t / vpp + sigma, at most
    ``problem.time_of`` (eq. LS1c's screen plus sigma)."""
    return w * max(t) + sum(t) / vpp + exposed_sync(t, s, beta)


def _score(problem: Problem, c: Assignment) -> float:
    """``_bound`` of a candidate."""
    return _bound(stage_times(problem, c), sync_times(problem, c), *_weights(problem, c.variant))
