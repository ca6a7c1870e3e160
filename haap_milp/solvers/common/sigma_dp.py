"""Eq. N8 (formulations/README.md): sigma's later rows (eq. T3) in the stage DP of eq. N4, by cases on their
bottleneck per stage count, to prune a node against the incumbent."""

from __future__ import annotations

import itertools

import numpy as np

from haap_milp.solvers.common.stage_dp import INF, PathDP, _assignment

SIGMA_BUCKETS = 4  # cases on sigma's bottleneck row per stage count (each halved up to SIGMA_SPLITS times)
SIGMA_SPLITS = 2
# eq. N8b: eq. N8 on interleaved variants too (eq. I1's sigma_v: the DP's stage costs are t / vpp, so its credits are
# beta / vpp times the earlier stages' times). Sound (tests/test_stage_dp.py) but off: no node pruned and the same gaps
# on the eight 4096-GPU rows of solve_scaling.py --cli-defaults (formulations/README.md, eq. N8b)
INTERLEAVED = False


def sigma_bound(dp: PathDP, a: float, mu: np.ndarray, cutoff: float, beta: float,
                plans: list | None = None) -> float:
    """Eq. N8: a bound on T over the node of ``dp`` with sigma's later rows (eq. T3), for pruning against ``cutoff``
    (-inf: some case falls below it, or nothing to add). Per stage count P (then slot k is pipeline stage P - k):
    every stage before slot k runs at most its slot's longest allowed stage time, so row k of eq. T3 gives
    sigma >= s_k - beta * sum_{k < k' <= P} tmax_{k'} =: sigma_k, a term of the stage alone, and sigma >= s_P (the
    first stage). Then sigma >= max_k sigma_k, a bottleneck: by cases on the bucket (e0, e1] the path's max falls
    in, T >= (M - 1) a + e0 + (the least Lagrangian path, its time and links only, whose every sigma_k <= e1); the
    node's bound is the least over P and buckets. Buckets from cutoff - (the path without thresholds) up cannot
    fall below the cutoff and are not run; a bucket that does is halved (up to SIGMA_SPLITS times) before giving up.
    ``plans``: the paths within every group's GPUs are appended (plans; their sigma is what the thresholds kept low).
    """
    t = dp.t
    if not dp.first or (t.vpp > 1 and not INTERLEAVED):
        return -INF
    base = dp.tau_term(a, a, None) - float(mu @ dp.cap)
    nonfirst, sync, tmax = later_rows(dp)
    first_time = {P: dp._rows(tm) for P, (tm, _) in dp._first_parts.items()}
    if dp.run(mu, tables=(first_time, dp.nonfirst, dp.k_max)) is None:
        return INF
    free = dict(dp.per_first)  # P -> least path cost, first stage's time only
    cases = []
    for P in sorted(free, key=free.get):  # the likeliest to fall below the cutoff first
        tm, sy = dp._first_parts[P]
        credit, lo = credits(tm, sy, tmax, P, beta)
        top = cutoff - (base + free[P]) + 1e-7 * abs(cutoff)  # a bucket from here up lies above the cutoff
        cases.append(base + free[P] + max(lo, top))
        if not lo < top:
            continue

        def least(x, P=P, tm=tm, sy=sy, credit=credit):  # the least path of P stages whose sigma_k are all <= x
            res = dp.run(mu, tables=({P: dp._rows(np.where(sy <= x, tm, INF))},
                                     {k: dp._rows(np.where(sync[k] - credit[k] <= x, nonfirst[k], INF)) for k in credit},
                                     P))
            if res is None:
                return INF
            if plans is not None and np.all(res.used <= dp.cap * (1 + 1e-9)):
                plans.append(_assignment(t, res))
            return res.cost

        todo = [(e0, e1, 0) for e0, e1 in itertools.pairwise(np.linspace(lo, top, SIGMA_BUCKETS + 1))]
        while todo:
            e0, e1, depth = todo.pop()
            val = base + e0 + least(e1)
            if val >= cutoff:
                cases.append(val)
            elif depth < SIGMA_SPLITS:
                mid = (e0 + e1) / 2
                todo += [(e0, mid, depth + 1), (mid, e1, depth + 1)]
            else:
                return -INF  # this node is not pruned by eq. N8
    return min(cases, default=INF)


def later_rows(dp: PathDP) -> tuple[dict, dict, dict]:
    """Per non-first slot k of the node: [n, L+1] the stage's time (option level, inf where not allowed), its sync
    s_k (eq. T3; inf alike) and the longest allowed time (eq. N8's credit per slot)."""
    t = dp.t
    c, L = t.coef, dp.L
    nn = np.arange(L + 1, dtype=float)[None, :]
    nonfirst = {k: dp._base(k, False) for k in range(1, dp.k_max)}
    sync = {k: np.where(np.isfinite(nonfirst[k]), c["sync_fixed"][:, None] + nn * c["sync_per_layer"][:, None]
                        + (c["sync_last"][:, None] if k == 1 else 0.0), INF) for k in nonfirst}
    tmax = {k: float(np.max(v[np.isfinite(v)], initial=0.0)) for k, v in nonfirst.items()}
    return nonfirst, sync, tmax


def credits(tm: np.ndarray, sy: np.ndarray, tmax: dict, P: int, beta: float) -> tuple[dict, float]:
    """Eq. N8 for P stages: per slot k < P the credit beta * (the longest allowed times of slots k+1..P; slot P the
    first stage's, ``tm``), and sigma's floor, the least first-stage sync (``sy``)."""
    credit, acc = {}, float(np.max(tm[np.isfinite(tm)], initial=0.0))  # slot P: the first stage's time
    for k in range(P - 1, 0, -1):
        credit[k] = beta * acc
        acc += tmax[k]
    return credit, float(np.min(np.where(np.isfinite(tm), sy, INF)))  # sigma >= s_P >= the least first-stage sync
