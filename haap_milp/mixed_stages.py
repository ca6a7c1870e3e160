"""Presolve's mixed stage options: data-parallel replicas of two GPU groups in one stage (formulations/ H1-H7).

Enumeration (eq. H7, bounded so that the search keeps its speed):

* pairs of GPU groups on one island (a pipeline stage across an island link would put a slow link in
  every micro-batch's DP sync and p2p);
* per group a GPU count from {all, 1/2, 1/4} of the group, a whole number of nodes each, and a tp of
  ``tp_candidates`` dividing it (replicas = count / tp); ep = 1 (MoE experts are not split across types);
  the same recompute mode on every replica;
* the samples of a micro-batch split by speed: per replica type an integer m_r >= 1 with
  sum_r count_r·m_r = B (eq. H2); the split with the smallest slowest-type layer time (eq. H3) is kept,
  found by bisection (one type's time grows and the other's falls along the splits). A fixed per-replica micro-batch
  (``--mbs``) allows only m_r = mbs;
* at most ``MAX_PER_PAIR`` options per pair and micro-batch variant: those with the least GPU-time per
  layer (lambda_o x GPUs), so large clusters do not flood the slot model.

Each kept option is an ``Option`` with ``mix`` (problem.Replicas per type) and its own p2p endpoint (one
per group pair, eq. H5).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from math import gcd

from haap_milp.errors import HaapInputError
from haap_milp.estimator.override import coverage, may_price
from haap_milp.parallel_rules import tp_allowed
from haap_milp.problem import Option, Replicas

TP_CANDIDATES = (1, 2, 4, 8)
SHARES = (1, 2, 4)  # a group's GPUs in a mixed stage: all, half, a quarter (whole nodes)
MAX_PER_PAIR = 16


def island_pairs(groups) -> list[tuple[int, int]]:
    """Pairs of group indices (a < b) on the same island (eq. H7)."""
    return [(a, b) for a in range(len(groups)) for b in range(a + 1, len(groups))
            if groups[a].island == groups[b].island]


def _sizes(g) -> list[int]:
    out = []
    for k in SHARES:
        n = g.capacity // k
        n -= n % g.gpus_per_node
        if n >= g.gpus_per_node and n not in out:
            out.append(n)
    return out


def _splits(b: int, na: int, nb: int, fixed: int | None) -> Sequence[int]:
    """The samples per replica of type a, m_a ascending, of the integer splits (m_a, m_b), both >= 1, with
    na·m_a + nb·m_b = b (eq. H2); m_b = (b - na·m_a) / nb. The m_a that solve it are one residue modulo nb / gcd,
    so they are a range (found in O(1), not by trying every m_a: 2 M tries per presolve on 256 GPUs x 3 types)."""
    if fixed:
        return [fixed] if (na + nb) * fixed == b else []
    g = gcd(na, nb)
    hi = (b - nb) // na  # the largest m_a that leaves m_b >= 1
    if b % g or hi < 1:
        return []
    step = nb // g
    first = (b // g) * pow(na // g, -1, step) % step  # na·m_a = b (mod nb), divided through by g
    return range(first if first >= 1 else first + step, hi + 1, step)


def _priceable(est, g, tp: int, m: int) -> bool:
    prof = est.profile
    return prof is None or may_price(coverage(prof, g.gpu_type, tp, m), prof.fallback)


def enumerate_options(est, model, training, groups, b: int, modes, dims, pair_index) -> list[Option]:
    """Mixed options of micro-batch variant ``b`` (eq. H7); ``pair_index[(a, b)]`` is the pair's p2p endpoint."""
    return [o for ga, gb in island_pairs(groups)
            for o in pair_options(est, model, training, groups, b, modes, dims, (ga, gb), pair_index[(ga, gb)])]


def pair_options(est, model, training, groups, b: int, modes, dims, pair: tuple[int, int], link: int,
                 memo: dict | None = None) -> list[Option]:
    """The mixed options of one group pair (``link``: its p2p endpoint) for micro-batch variant ``b``: at most
    MAX_PER_PAIR, the least GPU-time per layer first (eq. H7). ``memo``: ``_best_split``'s, kept across calls."""
    memo = {} if memo is None else memo
    ga, gb = pair
    A, B = groups[ga], groups[gb]
    cands = []
    for ta, tb in product(TP_CANDIDATES, TP_CANDIDATES):
        if not (tp_allowed(model.num_heads, model.kv_heads, ta, A.gpus_per_node)
                and tp_allowed(model.num_heads, model.kv_heads, tb, B.gpus_per_node)):
            continue
        for sa, sb in product(_sizes(A), _sizes(B)):
            if sa % ta or sb % tb:
                continue
            na, nb = sa // ta, sb // tb
            for rc in modes:
                best = _best_split(est, A, B, ta, tb, na, nb, rc, b, training.micro_batch_size, memo)
                if best is not None:
                    lam, (ma, mb) = best
                    mix = (Replicas(ga, ta, na, ma), Replicas(gb, tb, nb, mb))
                    cands.append((lam * (sa + sb), Option(group=ga, tp=ta, dp=na + nb, ep=1, recompute=rc,
                                                          uniform_dims=dims, mix=mix, link=link)))
    cands.sort(key=lambda c: (c[0], c[1].tp, c[1].dp, c[1].recompute, c[1].mix))
    return [o for _, o in cands[:MAX_PER_PAIR]]


def pair_batches(groups, pairs: list[tuple[int, int]], price=None) -> list[tuple[tuple[int, int], ...]]:
    """Eq. PAR5's shares of the pairs, so that pairs reading the same layer prices stay on one process. ``price(g)``:
    the prices group ``g`` reads, (GPU type, ``replica_island``) (default: its own island). Pairs of the same two
    prices are one bundle (on islands that price alike, a pair and its twin: the twin then reads only prices already
    made); the bundles go one per share where their first pairs lie on one island, else one share per island (two
    islands' bundles share no price)."""
    price = price or (lambda g: (groups[g].gpu_type, groups[g].island))
    bundles: dict[tuple, list[tuple[int, int]]] = {}
    for pr in pairs:
        bundles.setdefault((price(pr[0]), price(pr[1])), []).append(pr)
    by_island: dict[str, list[tuple[int, int]]] = {}
    for prs in bundles.values():
        by_island.setdefault(groups[prs[0][0]].island, []).extend(prs)
    if len(by_island) == 1:
        return [tuple(prs) for prs in bundles.values()]
    return [tuple(prs) for prs in by_island.values()]


def _best_split(est, A, B, ta, tb, na, nb, rc, b, fixed, memo: dict | None = None):
    """(slowest-type layer time, (m_a, m_b)) of the fastest split of b samples (eqs. H2, H3), or None.

    Along the splits (m_a ascending) type a's layer time grows and type b's falls, so the slowest of the two
    is smallest where they cross: bisection for the first split where a is the slower, then that split and
    the one before it are compared (log2 of the splits priced, not all). ``memo``: layer times already read
    (``_layer_time``), shared by the calls of one presolve process."""
    mas = _splits(b, na, nb, fixed)
    if est.profile is not None:  # (without a profile every point is priced: no filter to run)
        mas = [ma for ma in mas if _priceable(est, A, ta, ma) and _priceable(est, B, tb, (b - na * ma) // nb)]
    memo = {} if memo is None else memo

    def times(i: int) -> tuple[float, float] | None:
        ma = mas[i]
        ta_s = _layer_time(est, memo, A, ta, rc, ma)
        tb_s = _layer_time(est, memo, B, tb, rc, (b - na * ma) // nb)
        return None if ta_s is None or tb_s is None else (ta_s, tb_s)

    lo, hi = 0, len(mas)
    while lo < hi:  # first i with t_a >= t_b
        mid = (lo + hi) // 2
        t = times(mid)
        if t is None:
            return None
        if t[0] >= t[1]:
            hi = mid
        else:
            lo = mid + 1
    best = None
    for i in (lo - 1, lo):
        t = times(i) if 0 <= i < len(mas) else None
        if t is not None and (best is None or max(t) < best[0]):
            best = (max(t), (mas[i], (b - na * mas[i]) // nb))
    return best


def _layer_time(est, memo: dict, g, tp: int, rc: str, m: int) -> float | None:
    """One replica's layer time (s) on group ``g``'s GPUs at tp and m samples, priced as dp 1 (cached across replica
    counts: it depends on dp only through ZeRO-3's per-micro-batch gathers, which the option's final price, dp = D,
    includes); None where the estimator cannot run it. Kept in ``memo`` by (GPU type, island, tp, recompute, m): the
    estimator's own cache costs a ten-field key per read, and presolve reads ~200 k of them on 256 GPUs x 3 types.
    The island is ``est.replica_island``'s: two islands whose nodes price one replica alike (differing only in their
    NICs, as ``h100-80g:48@ib,h100-80g:48@roce``) read one price."""
    key = (g.gpu_type, g.island, tp, rc, m)
    t = memo.get(key, memo)
    if t is memo:
        island = est.replica_island(g.gpu_type, g.island)  # (islands that price one replica alike share the price)
        same = (g.gpu_type, island, tp, rc, m)
        t = memo.get(same, memo)
        if t is memo:
            try:
                t = est.layer_cost(g.gpu_type, tp, 1, 1, 1, rc, m, island=island).time_s
            except HaapInputError:  # a combination the estimator cannot run
                t = None
            memo[same] = t
        memo[key] = t
    return t


def replica_keys(groups, o: Option) -> tuple[tuple[str, str, int, int, int], ...]:
    """The estimator's keys (estimator/mixed.py) of a mixed option."""
    return tuple((groups[r.group].gpu_type, groups[r.group].island, r.tp, r.count, r.samples) for r in o.mix)


def endpoint_members(groups, pairs: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Groups behind each p2p endpoint: one per group, then one per mixed pair (eq. H5)."""
    return [(g,) for g in range(len(groups))] + [tuple(p) for p in pairs]
