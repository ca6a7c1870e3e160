"""Uniform Megatron-style baseline: the best plan plain Megatron-LM would run without a layout.

Search space (formulations/README.md, "uniform baseline"): one (tp, dp, recompute) signature
for every stage, ``P`` dividing ``L`` with ``L / P`` layers per stage (Megatron's default
even split), each stage placed on one GPU group; groups are filled in pipeline order, and every
order of the groups is tried (there are at most a handful). It is what a user gets from
hand-tuning tp/pp/dp on a mixed cluster, and the second baseline the exact plans are compared to.
"""

from __future__ import annotations

import time

import numpy as np

from haap_milp.deadline import current
from haap_milp.problem import Assignment, Problem, RawResult, Stage, evaluate, violations

USE_FLOOR = True  # skip placements whose eq. T1 floor reaches the best plan so far (exact)
# skip a signature's stage count whole where no placement's floor can be below the best plan so far (exact: plans its
# floor would skip, without walking them). Measured: llama3-70b on 256 GPUs of 3 types x 2 islands (6 groups), the
# baseline took 0.31 s for 88,068 placements its floor skipped one by one
USE_COUNT_FLOOR = True
# the clock is looked at every CHECK_EVERY placements, not only between signatures: one signature on many groups has
# orders by the million (16 islands of one GPU type: 16!/(16-P)! prefixes; it ran past a 2 s limit for minutes). Without
# a plan the walk goes on UNPLANNED_GRACE_S past its deadline, then ends with none (the baseline is a comparison and a
# warm-start candidate; the DP heuristic and the exact search plan without it)
CHECK_EVERY = 256
UNPLANNED_GRACE_S = 1.0


def _holds(problem: Problem, sig_opts: dict[int, int], gpus: int) -> dict[int, int]:
    """Stages of ``gpus`` GPUs each group of the signature holds."""
    return {g: problem.group_capacity[g] // gpus for g in sorted(sig_opts)}


def _least_floor(lt: np.ndarray, sig_opts: dict[int, int], holds: dict[int, int], p: int, m: int) -> float:
    """A bound on (M - 1) max_j lt_j + sum_j lt_j over every placement of ``p`` stages (``solve``'s floor over L/P):
    its slowest stage is no faster than the group where the groups, fastest first, first hold ``p`` stages (the groups
    a placement uses hold ``p`` stages at least), and each stage no faster than the fastest group; inf: none holds."""
    got, ranked = 0, sorted((float(lt[o]), holds[g]) for g, o in sig_opts.items() if holds[g] > 0)
    for f, k in ranked:
        got += k
        if got >= p:
            return (m - 1) * f + p * ranked[0][0]
    return float("inf")


def _placements(problem: Problem, sig_opts: dict[int, int], p: int, gpus: int):
    """Yield option lists (one per stage) filling groups in each order of the groups: each group in turn takes as
    many stages as it holds until ``p`` are placed. Only the groups before the last one used decide a list, so the
    orders are walked as prefixes (depth first, in the lexicographic order of ``itertools.permutations``, each list
    at its first order): 6 groups are 720 orders but far fewer prefixes. A group too small for one stage takes none
    wherever it stands, so it is left out. Each prefix gives its own list (an option belongs to one group), so no
    list comes twice."""
    holds = _holds(problem, sig_opts, gpus)
    groups = [g for g, k in holds.items() if k > 0]

    def walk(chosen: list, used: set, left: int):
        for g in groups:
            if g in used:
                continue
            take = min(holds[g], left)
            nxt = chosen + [sig_opts[g]] * take
            if take == left:
                yield nxt
            else:
                yield from walk(nxt, used | {g}, left - take)

    yield from walk([], set(), p)


class _Clock:
    """Whether the walk stops: past the deadline with a plan, or UNPLANNED_GRACE_S past it without one (or at once
    on Ctrl-C with one)."""

    def __init__(self):
        self.dl, self.late_since, self.stopped = current(), None, False

    def out(self, planned: bool) -> bool:
        if not self.dl.expired():
            return False
        if self.late_since is None:
            self.late_since = time.perf_counter()
        self.stopped = planned or time.perf_counter() - self.late_since > UNPLANNED_GRACE_S
        return self.stopped


def solve(problem: Problem, options=None, hint=None) -> RawResult:
    """Exhaustive over the (small) uniform space; returns the best feasible assignment."""
    t0 = time.perf_counter()
    best, best_t, tried, skipped = None, float("inf"), 0, 0
    L = problem.num_layers
    clock = _Clock()  # past its deadline (or interrupted) with a plan in hand: the best so far
    for vi, var in enumerate(problem.variants):
        if var.vpp > 1:  # the uniform baseline is plain 1F1B (Megatron's default schedule)
            continue
        if clock.out(best is not None):
            break
        by_sig: dict[tuple, dict[int, int]] = {}
        for i in np.flatnonzero(var.allowed):
            o = problem.options[i]
            if o.mix:  # uniform plans have one GPU group per stage
                continue
            # one option per (signature, group); ep: keep the first (smallest) allowed
            by_sig.setdefault((o.tp, o.dp, o.recompute, o.ep, o.zero, o.etp), {}).setdefault(o.group, int(i))  # zero: eq. Z1
        # eq. T1: T = (M - 1) tau + sum_j t_j + sum_j c_j + sigma >= (L/P) ((M - 1) max_j lt_j + sum_j lt_j) (tau >= every
        # t_j >= (L/P) lt_j, every term >= 0; not with eq. EX1's terms, which may be negative): a placement whose bound
        # reaches the best so far is skipped unchecked. Exact; measured on mixtral-8x7b x 3 types x 2 islands x 64 GPUs
        # (6 groups, 720 group orders): 69,580 placements checked in 3.3 s before (with M max_j lt_j, the bound until
        # 2026-12-04; the sum term skips the placements within (P - 1)/M of the best as well)
        M = var.num_microbatches
        floor = np.asarray(var.layer_time, float) if USE_FLOOR and var.extra is None else None
        for sig_opts in by_sig.values():
            if clock.out(best is not None):
                break
            gpus = problem.options[next(iter(sig_opts.values()))].num_gpus  # tp*dp*cp (eq. CP1)
            holds = _holds(problem, sig_opts, gpus)
            for p in range(1, min(problem.max_stages, L) + 1):
                if L % p:
                    continue
                if USE_COUNT_FLOOR and floor is not None and (L // p) * _least_floor(
                        floor, sig_opts, holds, p, M) >= best_t:
                    continue
                for chosen in _placements(problem, sig_opts, p, gpus):
                    if (tried + skipped) % CHECK_EVERY == 0 and clock.out(best is not None):
                        break
                    if floor is not None and (L // p) * ((M - 1) * max(floor[o] for o in chosen)
                                                         + sum(floor[o] for o in chosen)) >= best_t:
                        skipped += 1
                        continue
                    a = Assignment(vi, tuple(Stage(o, L // p) for o in chosen))
                    tried += 1
                    # the time first: only a plan that beats the best needs the check (the same plan is kept; measured:
                    # mixtral-8x7b x 4096 x 3 types x 2 islands, 24,306 placements, the check 1.9 of 3.9 s, profiled)
                    t = evaluate(problem, a)
                    if t < best_t and not violations(problem, a):
                        best, best_t = a, t
    wall = time.perf_counter() - t0
    if best is None and clock.stopped:
        return RawResult("NO_SOLUTION", "uniform", wall_time_s=wall, stats={"tried": tried},
                         message="time limit reached before any uniform plan was found")
    if best is None:
        return RawResult("INFEASIBLE", "uniform", wall_time_s=wall, stats={"tried": tried},
                         message="no uniform (even-split, same tp/dp/recompute) plan fits")
    return RawResult("FEASIBLE", "uniform", best, best_t, None, wall, stats={"tried": tried, "skipped_by_floor": skipped})
