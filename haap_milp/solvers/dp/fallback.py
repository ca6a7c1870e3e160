"""Fallback of the DP heuristic (formulations/dp.md, eq. DP6): a beam search over pipeline
states (slots filled from the end, layers placed, GPUs used per group, tp of the last stage,
signature), one option and layer count per step. States with the same key have the same
feasible completions, so keeping one per key loses no feasibility: while the beam is not
truncated the search finds a plan whenever one exists. Used only by ``dp.py``.
"""

from __future__ import annotations

import time

from haap_milp.problem import Assignment, Problem, Stage, evaluate, violations
from haap_milp.solvers.common import build_tables

BEAM = 4000  # states kept per slot
TIME_LIMIT_S = 1.0


def beam_search(problem: Problem, beam: int = BEAM, time_limit_s: float = TIME_LIMIT_S,
                order=None) -> Assignment | None:
    """Best plan found (by ``evaluate``), or None. ``order``: the variants in the order to search them (the
    caller's most promising first: the time limit usually ends the search after a few variants)."""
    deadline = time.perf_counter() + time_limit_s
    best: tuple[float, Assignment] | None = None
    for v in (range(len(problem.variants)) if order is None else order):
        t = build_tables(problem, v)
        if t.p_min == 0:
            continue
        level = {(0, (0,) * len(problem.groups), -1, -1): (0.0, 0.0, ())}
        for k in range(1, t.p_max + 1):
            nxt: dict = {}
            for key, (mx, tot, stages) in level.items():
                best = _extend(problem, t, k, key, mx, tot, stages, nxt, best)
                if time.perf_counter() > deadline:
                    return best[1] if best else None
            kept = sorted(nxt.items(), key=lambda kv: ((t.M - 1) * kv[1][0] + kv[1][1], kv[0]))[:beam]
            level = dict(kept)
    return best[1] if best else None


def _extend(problem: Problem, t, k: int, key, mx: float, tot: float, stages: tuple, nxt: dict, best):
    layers, usage, tp_last, sig = key
    lt, xt = t.coef["layer_time"], t.coef["last_time"]
    for i in range(t.n):
        new_usage = tuple(u + int(d) for u, d in zip(usage, t.use[i]))  # eq. G1 (mixed: several groups)
        if any(u > c for u, c in zip(new_usage, problem.group_capacity)) or \
                (problem.uniform and sig >= 0 and t.sig[i] != sig):
            continue
        n_first = t.L - layers
        tp_end = int(t.tp[i]) if k == 1 else tp_last
        if 1 <= n_first <= t.Uf_mem[k - 1, i] and (not problem.same_tp_first_last or int(t.tp[i]) == tp_end):
            st = ((int(t.opts[i]), n_first),) + stages
            a = Assignment(t.v, tuple(Stage(o, n) for o, n in st))
            if not violations(problem, a):
                obj = evaluate(problem, a)
                if best is None or obj < best[0]:
                    best = (obj, a)
        if k >= t.p_max:
            continue
        for n in range(1, min(int(t.U_mem[k - 1, i]), t.L - layers - 1) + 1):
            time_k = n * lt[i] + (xt[i] if k == 1 else 0.0)
            nk = (layers + n, new_usage, tp_end, int(t.sig[i]) if problem.uniform else -1)
            val = (max(mx, time_k), tot + time_k, ((int(t.opts[i]), n),) + stages)
            old = nxt.get(nk)
            if old is None or (t.M - 1) * val[0] + val[1] < (t.M - 1) * old[0] + old[1]:
                nxt[nk] = val
    return best
