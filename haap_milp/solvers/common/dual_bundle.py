"""The Lagrangian dual of eq. N4 maximised by a cutting-plane (Kelley) method in a trust region (eq. N7,
formulations/README.md), in place of projected subgradient steps when several rows are priced.

Every DP run at multipliers mu >= 0 returns the least path p(mu) and so one linear piece of the concave dual

    LB(mu) = min_p [ (M - 1) a + cost_p + mu . (used_p - cap) ]      (cost_p: the path's time terms, s)

Each evaluation is a valid bound (weak duality), whatever the mu, so the choice of mu only decides strength, never
soundness. The pieces found so far over-estimate LB; the next mu maximises that model inside a box of half-width
``delta`` around the best mu so far (a small LP: R multipliers, one row per piece). The box doubles after a step
that raises the bound and halves after one that does not (a trust region, the usual stabilisation of Kelley's
method). Why: with three GPU types the subgradient's 12 steps stopped 20-40 % below nodes the LP proves empty: the
dual is unbounded there (every path overfills some weighted mix of the groups) and the step rule
``(target - LB) / |g|^2`` creeps along that ray; the model's LP finds the ray in a few pieces (measured:
llama3-70b x 3 types x 1024 GPUs, 5-8 DP runs to reach the cut-off on nodes the subgradient left at 9-13 s,
``benchmarks/results/solve_scaling.md``).
"""

from __future__ import annotations

import math
import time

import numpy as np

from haap_milp.solvers.common.lp import highspy, run
from haap_milp.solvers.common.slot_bounds import Tables
from haap_milp.solvers.common.stage_dp import INF, NodeBound, PathDP, _assignment, _mu_scale

MAX_STEPS = 30  # DP runs a node (each 5-40 ms on 3 types); most nodes stop earlier (cut-off or converged)
CONVERGED_RTOL = 1e-4  # stop when the model's best inside the box is within this of the best bound (relative)


class _Master:
    """max z s.t. z - g_p . mu <= c_p (one row per piece p), lo <= mu <= hi: the cutting-plane model's LP."""

    def __init__(self, R: int):
        self.R = R
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        inf = highspy.kHighsInf
        h.addVars(R + 1, np.zeros(R + 1), np.r_[np.full(R, inf), inf])
        h.changeColBounds(R, -inf, inf)
        h.changeColsCost(R + 1, np.arange(R + 1, dtype=np.int32), np.r_[np.zeros(R), -1.0])  # HiGHS minimises
        self.h, self.idx = h, np.arange(R + 1, dtype=np.int32)

    def add(self, c: float, g: np.ndarray) -> None:
        self.h.addRow(-highspy.kHighsInf, float(c), self.R + 1, self.idx, np.r_[-g, 1.0])

    def solve(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, float] | None:
        """(mu, the model's value there), None when HiGHS gives no optimum."""
        self.h.changeColsBounds(self.R, self.idx[:-1], lo, hi)
        run(self.h)
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        x = np.asarray(self.h.getSolution().col_value, float)
        return np.maximum(x[:self.R], 0.0), float(x[self.R])


def bundle_bound(problem, t: Tables, a: float, dp: PathDP, cutoff: float | None, mu0: np.ndarray | None = None,
                 max_steps: int = MAX_STEPS, deadline: float = math.inf) -> NodeBound:
    """Eq. N7: the Lagrangian bound of eq. N4 with mu chosen by the trust-region cutting-plane method; stops at
    ``cutoff``, at convergence, after ``max_steps`` DP runs or at ``deadline`` (perf_counter). Same result type
    as ``stage_dp.node_bound`` (its ``plan``: a path within every row, offered by the caller)."""
    cap = dp.cap
    R = len(cap)
    base = t.tau_weight * a  # (M - 1) a; eq. I1: (M - 1/vpp) a
    mu = np.zeros(R) if mu0 is None or len(mu0) != R else np.maximum(np.asarray(mu0, float), 0.0)
    active = dp.usage.any(axis=0)  # rows no option draws from stay at 0 (their pieces have g = -cap: mu 0 is best)
    mu = np.where(active, mu, 0.0)
    delta = max(_mu_scale(t, cap), float(mu.max(initial=0.0)))
    best = NodeBound(-INF, mu.copy())
    center = mu.copy()
    master = _Master(R) if highspy is not None else None
    step = 0
    for step in range(1, max_steps + 1):
        res = dp.run(mu)
        if res is None:
            return NodeBound(INF, mu, None, step)
        val = base + res.cost - float(mu @ cap)
        g = res.used - cap  # the piece's slope: a supergradient of LB at mu
        if np.all(g <= 1e-9 * cap) and best.plan is None:
            best.plan = _assignment(t, res)
        if val > best.bound_s:
            raised = val > best.bound_s + 1e-9 * abs(val)
            best = NodeBound(val, mu.copy(), best.plan, step, res.used)
            center = mu.copy()
            delta = delta * 2 if raised else delta
        else:
            delta *= 0.5
        if cutoff is not None and best.bound_s >= cutoff:
            break
        gp = np.where(active & ((mu > 0) | (g > 0)), g, 0.0)
        if not np.any(gp) and val >= best.bound_s:
            break  # complementary slackness: mu is optimal
        if master is None or time.perf_counter() > deadline:
            break
        master.add(val - float(g @ mu), g)  # z <= val + g . (mu' - mu)
        got = master.solve(np.where(active, np.maximum(center - delta, 0.0), 0.0), np.where(active, center + delta, 0.0))
        if got is None:
            break
        mu, z = got
        if z <= best.bound_s + CONVERGED_RTOL * max(abs(best.bound_s), 1e-9):
            break  # the model (above LB) is no higher in a box around the best mu: a maximum (LB is concave)
    best.steps = step
    return best
