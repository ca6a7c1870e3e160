"""The stage DP's Lagrangian node bound (eq. N4) against the brute-force oracle on random small instances."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem

from haap_milp.problem import violations
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import capacity_dp, stage_dp
from haap_milp.solvers.common.bounds import variant_bound
from haap_milp.solvers.common.branch_and_bound import _steady, _worst_tau
from haap_milp.solvers.common.capacity_dp import capacity_bound
from haap_milp.solvers.common.slot_bounds import build_tables
from haap_milp.solvers.common.stage_dp import PathDP, node_bound
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)


def _partition_bound(problem, v: int, cuts: int, rng) -> float:
    """The least node bound over a random partition of variant v's tau range into ``cuts`` intervals."""
    t0 = build_tables(problem, v)
    vb = variant_bound(problem, t0)
    if not math.isfinite(vb.total_s):
        return math.inf
    bot, top = vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01  # eq. B2's tau bound, as the search's roots
    edges = np.sort(np.concatenate([[bot, top], rng.uniform(bot, top, cuts - 1)]))
    out = math.inf
    for a, b in itertools.pairwise(edges):
        t = build_tables(problem, v, float(b))
        if t.p_min == 0:
            continue  # no plan of this variant has every stage within b
        nb = node_bound(problem, t, float(a), float(b), t.p_min, t.p_max, None, rng.uniform(0, 1e-3, len(problem.groups)))
        s = int(rng.integers(0, len(problem.groups)))  # eq. N5 with any group in the state is a bound too
        cb, plan = capacity_bound(problem, PathDP(problem, t, float(b), t.p_min, t.p_max), float(a), nb.mu, s)
        out = min(out, max(nb.bound_s, cb))
        for p in (nb.plan, plan):  # a path within every group's GPUs is a feasible plan (its tau may be below a)
            assert p is None or violations(problem, p) == []
    return out


@pytest.mark.parametrize("rmax", [capacity_dp.RMAX, 2])  # 2: the floor-rounded capacity units of eq. N5
def test_node_bounds_never_exceed_the_optimum_and_close_in_on_it(rmax, monkeypatch):
    monkeypatch.setattr(capacity_dp, "RMAX", rmax)
    monkeypatch.setattr(stage_dp, "MAX_STEPS", 40)  # the relaxation's strength, not the search's step budget
    rng = np.random.default_rng(3)
    tight = 0
    checked = 0
    for seed in range(36):
        problem = random_problem(seed, uniform=False, same_tp_first_last=False)
        brute = get_solver("brute")(problem, EXACT)
        bounds = [_partition_bound(problem, v, int(rng.integers(1, 6)), rng) for v in range(len(problem.variants))]
        if brute.status == "INFEASIBLE":
            continue
        checked += 1
        lb = min(bounds)
        assert lb <= brute.objective_s * (1 + 1e-9) + 1e-12, (seed, lb, brute.objective_s)
        # not vacuous: at the optimum's own steady period (a = b = tau*) the bound is close to the optimum
        a = brute.assignment
        tau = _steady(problem, a)
        t = build_tables(problem, a.variant, tau)
        at = node_bound(problem, t, tau, tau, t.p_min, t.p_max, None).bound_s
        tight += at >= 0.95 * brute.objective_s
    assert checked >= 15 and tight >= checked * 3 // 4, (checked, tight)
