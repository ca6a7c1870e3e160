"""The Lagrangian dual of eq. N4 maximised by a cutting-plane (Kelley) method in a trust region (eq. N11,
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
import weakref
from contextlib import contextmanager

import numpy as np

from haap_milp.solvers.common.lp import highspy, run
from haap_milp.solvers.common.slot_bounds import Tables
from haap_milp.solvers.common.stage_dp import INF, NodeBound, PathDP, _assignment, _mu_scale

MAX_STEPS = 30  # DP runs a node (each 5-40 ms on 3 types); most nodes stop earlier (cut-off or converged)
# eq. N11b: the resource-only ray search, at most RAY_STEPS DP runs, after the bundle's step RAY_AT when that step's
# least path overfills a row (measured: llama3-70b x 64 GPUs x 3 types x 2 islands, all 24 nodes of the proof hold no
# plan; two of them the node LP proved empty in 2.05 and 1.24 s after the bundle's 30 runs stopped at 141.9 s against
# a 156.8 s cut-off; the ray search in 1-14 runs, 5-150 ms a node)
RAY_STEPS = 24
RAY_AT = 1
CONVERGED_RTOL = 1e-4  # stop when the model's best inside the box is within this of the best bound (relative)
USE_GPU_TIME = True  # price eq. C1 too (eq. N12, class GpuTimeRows)
USE_RAY = True  # eq. N11b


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

    def on_simplex(self) -> _Master:
        """The multipliers kept to sum 1 (eq. N11b's directions)."""
        self.h.addRow(1.0, 1.0, self.R, self.idx[:-1], np.ones(self.R))
        return self

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


class GpuTimeRows:
    """Eq. C1 as priced rows of the DP: per group g, sum_j d_jg t_j <= cap_g tau (each stage takes <= tau on its
    GPUs), with multipliers lam_g >= 0. A stage of footprint row r pays lam . use_r times its time; per slot and
    layer count the DP keeps the cheapest option of a row, so it pays lam_r x the least time of the row's options
    there (a lower bound on the option's own: the first stage also carries its DP sync, so its cheapest option
    need not be the fastest; a lower stage cost keeps the bound sound). The tau term becomes
    (tau_weight - lam . cap) tau, least at tau = a or at tau = b. Why: on llama3-70b x 3 types x 1024 GPUs the
    node LP is 13.48 s with eq. C1 and 12.40 s without it; the DP bound without it 12.16 s."""

    def __init__(self, dp: PathDP, t: Tables, b: float):
        self.dp, self.b = dp, b
        c = t.coef
        n = np.arange(dp.L + 1, dtype=float)[None, :]
        self.work = {}  # (first, k) -> [rows, L+1] least stage time (s, eq. T1's t) of the row's options
        for first, table in ((True, dp.first), (False, dp.nonfirst)):
            for k in table:
                w = n * c["layer_time"][:, None] + (c["first_time"][:, None] if first else 0.0) \
                    + (c["last_time"][:, None] if k == 1 else 0.0)
                ok = np.isfinite(dp._base(k, first))
                least = dp._rows(np.where(ok, w, INF))[0]
                self.work[first, k] = np.where(np.isfinite(least), least, 0.0)  # (the row's cost is inf there)
        self.use = dp.row_usage[:, :dp.G]  # [rows, G] GPUs of each group

    @contextmanager
    def priced(self, lam: np.ndarray):
        """The DP's stage costs raised by lam_r x time while inside (any DP over ``dp.first``/``dp.nonfirst``,
        e.g. eqs. N5, N6, then prices the C1 rows too)."""
        dp = self.dp
        lam_r = (self.use @ lam)[:, None]
        saved = dp.first, dp.nonfirst, dp.extra_priced
        try:
            dp.extra_priced = True  # (eq. N10's in-flight cut reads costs as times: off while priced)
            dp.first = {k: (cost + lam_r * self.work[True, k], opt) for k, (cost, opt) in saved[0].items()}
            dp.nonfirst = {k: (cost + lam_r * self.work[False, k], opt) for k, (cost, opt) in saved[1].items()}
            yield
        finally:
            dp.first, dp.nonfirst, dp.extra_priced = saved

    def tau_shift(self, t: Tables, a: float, lam: np.ndarray) -> float:
        """What to add to a bound that charged tau_weight x a: (tau_weight - lam . cap) tau at its least over
        [a, b], less tau_weight x a."""
        w = t.tau_weight - float(lam @ self.dp.cap[:self.dp.G])
        return w * (a if w >= 0 else self.b) - t.tau_weight * a

    def run(self, mu: np.ndarray, lam: np.ndarray):
        """One DP run with the rows' costs raised by lam_r x time; (path result, [G] the path's GPU-time)."""
        dp = self.dp
        with self.priced(lam):
            res = dp.run(mu)
        if res is None:
            return None, None
        P = len(res.stages)
        gt = np.zeros(dp.G)
        for j, (i, n) in enumerate(res.stages):  # pipeline order: slot P first
            r = int(dp._row_of[i])
            gt += self.use[r] * self.work[j == 0, P - j][r, n]
        return res, gt


_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # PathDP -> its GpuTimeRows (built once a node)


def price_rows(dp: PathDP, t: Tables, b: float) -> GpuTimeRows:
    """Eq. C1's rows for ``dp`` (what ``bundle_bound`` sets up), so that ``with_gpu_time`` prices them on it."""
    gtr = _ROWS.get(dp)
    if gtr is None:
        gtr = _ROWS[dp] = GpuTimeRows(dp, t, b)
    return gtr


def with_gpu_time(dp: PathDP, t: Tables, a: float, x: np.ndarray, bound_fn, *args):
    """Eq. N12 around another DP bound of the node (eqs. N5, N6): ``bound_fn(*args)`` -> (bound, ...) run with the C1
    rows priced at ``x``'s lam (the multipliers ``bundle_bound`` returned: mu, then lam) and its bound moved by
    the tau term; without lam, or before ``bundle_bound`` priced them on this ``dp``, ``bound_fn(*args)`` as it is.
    Sound for any lam >= 0 (the same Lagrangian argument as eq. N12, with the state DP's own G1 handling)."""
    gtr = _ROWS.get(dp)
    lam = np.maximum(np.asarray(x, float)[len(dp.cap):], 0.0)
    if gtr is None or len(lam) != dp.G or not lam.any():
        return bound_fn(*args)
    with gtr.priced(lam):
        val, *rest = bound_fn(*args)
    return (val + gtr.tau_shift(t, a, lam), *rest)


@contextmanager
def _resources_only(dp: PathDP):
    """The DP's stage and link costs set to 0 where allowed (inf kept) while inside: ``dp.run(d)`` is then the least
    ``d . used`` over the node's paths, exactly (memory, eqs. D1 and X1 and the usable links stay as they are)."""
    saved = dp.first, dp.nonfirst, dp.link, dp.extra_priced, getattr(dp, "per_first", None)

    def zero(table):
        return {k: (np.where(np.isfinite(cost), 0.0, INF), opt) for k, (cost, opt) in table.items()}

    try:
        dp.extra_priced = True  # (eq. N10's in-flight cut reads costs as times: off)
        dp.first, dp.nonfirst, dp.link = zero(saved[0]), zero(saved[1]), np.where(np.isfinite(saved[2]), 0.0, INF)
        yield
    finally:
        dp.first, dp.nonfirst, dp.link, dp.extra_priced = saved[:4]
        if saved[4] is not None:
            dp.per_first = saved[4]  # (eq. N8 reads the last time-priced run's)


def resource_ray(dp: PathDP, d0: np.ndarray | None = None, max_steps: int = RAY_STEPS) -> tuple[bool, int]:
    """Eq. N11b: (found, DP runs made); found when some d >= 0 on the priced rows (G1, and the budget W1) has
    min_p d . (used_p - cap) > 0 over the node's paths p: then no path, nor any convex mix of paths, fits the rows,
    so the node holds no plan (its Lagrangian dual is unbounded along d). phi(d) = min_p d . (used_p - cap) is
    concave and piecewise linear; it is maximised over the simplex by Kelley's method (each DP run with zero time
    costs gives the exact minimiser p and the cut phi(d') <= d' . (used_p - cap), valid for every d'), from ``d0``
    (e.g. the bundle's multipliers) or the rows' uniform mix. Not found when the model's maximum reaches <= 0 (some
    mix of the paths found fits) or after ``max_steps`` runs. Why: the bundle of eq. N11 climbs such a ray only as
    fast as its trust region grows, and the node LP took 1-2 s to prove these nodes empty."""
    cap = dp.cap
    active = dp.usage.any(axis=0)
    R = len(cap)
    if highspy is None or not active.any():
        return False, 0
    d = active.astype(float) if d0 is None else np.maximum(np.asarray(d0, float)[:R], 0.0) * active
    if not d.any():
        d = active.astype(float)
    d /= d.sum()
    master = _Master(R).on_simplex()  # max z s.t. z <= d . g_p (per path p), sum d = 1, 0 <= d (0 on unused rows)
    lo, hi = np.zeros(R), active.astype(float)
    tol = 1e-9 * float(cap.sum())
    with _resources_only(dp):
        for runs in range(1, max_steps + 1):
            res = dp.run(d)
            if res is None:
                return True, runs  # no path at all
            g = res.used - cap
            if float(d @ g) > tol:
                return True, runs
            master.add(0.0, g)
            got = master.solve(lo, hi)
            if got is None:
                return False, runs
            d, z = got
            if z <= tol:
                return False, runs  # every d has a path found so far within the rows
    return False, max_steps


def _next(master: _Master, center: np.ndarray, width: np.ndarray, free: np.ndarray):
    """The model's best x in the box (coordinates not ``free`` held at 0): (x, value, whether the box binds
    nowhere but at x >= 0), None when HiGHS fails."""
    lo, hi = np.where(free, np.maximum(center - width, 0.0), 0.0), np.where(free, center + width, 0.0)
    got = master.solve(lo, hi)
    if got is None:
        return None
    x, z = got
    edge = free & ((x >= hi - 1e-9 * width) | ((x <= lo + 1e-9 * width) & (lo > 0)))
    return x, z, not edge.any()


def bundle_bound(problem, t: Tables, a: float, dp: PathDP, cutoff: float | None, mu0: np.ndarray | None = None,
                 max_steps: int = MAX_STEPS, deadline: float = math.inf, b: float | None = None) -> NodeBound:
    """Eq. N11: the Lagrangian bound of eq. N4 with mu chosen by the trust-region cutting-plane method; stops at
    ``cutoff``, at convergence, after ``max_steps`` DP runs or at ``deadline`` (perf_counter). ``b``: the node's
    upper tau; when given (finite) the GPU-time rows of eq. C1 are priced too (``GpuTimeRows``). Same result type
    as ``stage_dp.node_bound`` (its ``plan``: the cheapest path within every row, offered by the caller; its
    ``mu``: the G1 and budget multipliers, then C1's lam when priced; ``mu0`` may be either form)."""
    cap = dp.cap
    R, G = len(cap), dp.G
    gtr = price_rows(dp, t, b) if USE_GPU_TIME and b is not None and math.isfinite(b) else None
    nl = G if gtr is not None else 0  # the lam coordinates follow mu's
    capg = cap[:G]
    x0 = np.zeros(R + nl)
    if mu0 is not None and len(mu0) in (R, R + G):  # mu, or mu then lam (a parent's warm start)
        m0 = np.maximum(np.asarray(mu0, float), 0.0)[:R + nl]
        x0[:len(m0)] = m0
    mu = x0[:R]
    active = np.r_[dp.usage.any(axis=0), dp.usage[:, :G].any(axis=0)[:nl]]  # rows some option draws from
    # first the G1 (and budget) rows alone: they find the rays of nodes with no plan in a few runs; the C1 rows join
    # once that converges (their cuts are kept from the start: every run returns the path's GPU-time too)
    phase = np.r_[np.ones(R, bool), np.full(nl, bool(x0[R:].any()))]  # (a warm lam: all at once)
    x = np.where(active, x0, 0.0)
    # trust-region half-widths per coordinate: mu in s per GPU, lam in 1 / GPU (lam . cap ~ tau's weight)
    unit = np.r_[np.full(R, _mu_scale(t, cap)), np.full(nl, t.tau_weight / max(float(capg.sum()), 1.0))]
    unit = np.where(unit > 0, unit, 1e-9)  # (M = 1: tau has no weight)
    delta = max(1.0, float(np.max(x / unit)))
    best = NodeBound(-INF, x.copy())
    center = x.copy()
    master = _Master(R + nl) if highspy is not None else None
    step, plan, plan_cost, ray_runs = 0, None, INF, 0
    pp = None  # eq. N16
    for step in range(1, max_steps + 1):
        mu, lam = x[:R], x[R:]
        if gtr is None:
            res, gt = dp.run(mu), None
        else:
            res, gt = gtr.run(mu, lam)
        if res is None:
            return NodeBound(INF, mu, plan, step)
        w = t.tau_weight - (float(lam @ capg) if nl else 0.0)
        tau = a if w >= 0 else b  # the least of (tau_weight - lam . cap) tau over [a, b]
        val = w * tau + res.cost - float(mu @ cap)
        pp = dp.per_p(val - res.cost, pp)
        g = np.r_[res.used - cap, (gt - capg * tau) if nl else np.zeros(0)]  # the piece's slope at x
        if np.all(g[:R] <= 1e-9 * cap):  # a path within every row: a plan; keep the cheapest (its time terms)
            cost = res.cost - float(mu @ res.used) - (float(lam @ gt) if nl else 0.0)
            if cost < plan_cost:
                plan, plan_cost = _assignment(t, res), cost
        if val > best.bound_s:
            raised = val > best.bound_s + 1e-9 * abs(val)
            best = NodeBound(val, x.copy(), None, step, res.used)
            center = x.copy()
            delta = delta * 2 if raised else delta
        else:
            delta *= 0.5
        if cutoff is not None and best.bound_s >= cutoff:
            break
        if step == RAY_AT and USE_RAY and np.any(res.used > cap * (1 + 1e-9)):  # eq. N11b
            empty, ray_runs = resource_ray(dp, x[:R])
            if empty:  # the node holds no plan
                return NodeBound(INF, best.mu, None, step + ray_runs, best.used, per_p=np.full_like(pp, INF))
        if master is None or time.perf_counter() > deadline:
            break
        master.add(val - float(g @ x), g)  # z <= val + g . (x' - x)
        got = _next(master, center, delta * unit, active & phase)
        if got is not None and got[1] <= best.bound_s + CONVERGED_RTOL * max(abs(best.bound_s), 1e-9) \
                and not phase.all():
            phase[:], delta = True, 1.0  # converged on the G1 rows: the C1 rows join
            got = _next(master, center, delta * unit, active & phase)
        if got is None:
            break
        x, z, interior = got
        if z <= best.bound_s + CONVERGED_RTOL * max(abs(best.bound_s), 1e-9):
            break  # the model (above LB) is no higher in a box around the best x: a maximum (LB is concave)
        if cutoff is not None and z < cutoff and interior and phase.all():
            break  # the model's global maximum (the box does not bind) is below the cut-off: no prune here
    best.steps, best.plan, best.per_p = step + ray_runs, plan, pp
    return best
