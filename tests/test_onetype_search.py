"""Eqs. N13c (the LP's trial) and N14c (the capacity DP where one group's multiplier leaves its path slack) against
brute force on one-group instances (one GPU type, one island: the case both were measured on)."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem

from haap_milp.problem import violations
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.solvers.common import stage_dp
from haap_milp.solvers.common.branch_and_bound import _steady
from haap_milp.solvers.common.capacity_dp import capacity_bound
from haap_milp.solvers.common.slot_bounds import build_tables
from haap_milp.solvers.common.stage_dp import PathDP, node_bound
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)


@pytest.mark.parametrize("name", ["cpsat", "milp"])
def test_lp_trial_off_from_the_start_still_matches_brute_force(name, monkeypatch):
    """Eq. N13c with LP_TRIAL = 0: every node the DPs bound is split without its LP (the model built only for the
    engine); the search stays exact. Fails if a node were closed without a bound (e.g. returning instead of pushing)."""
    monkeypatch.setattr(bb, "LP_TRIAL", 0)
    skipped = checked = 0
    for seed in range(24):
        problem = random_problem(seed, num_groups=1, num_layers=5 + seed % 3, max_stages=4, max_options=6)
        brute = get_solver("brute")(problem, EXACT)
        res = get_solver(name)(problem, EXACT)
        assert res.status == brute.status, (seed, res.status, brute.status, res.message)
        if brute.status != "OPTIMAL":
            continue
        checked += 1
        tol = res.stats.get("tolerance_s", 0.0) + 1e-6 * brute.objective_s
        assert brute.objective_s * (1 - 1e-9) <= res.objective_s <= brute.objective_s + tol, seed
        assert res.bound_s <= brute.objective_s * (1 + 1e-9)
        skipped += res.stats.get("lp_skipped", 0) > 0
    assert checked >= 12 and skipped >= 3, (checked, skipped)


def test_capacity_dp_on_a_slack_lagrangian_path_is_a_bound_and_binds(monkeypatch):
    """Eq. N14c: with one group, at the optimum's own tau, when eq. N4's least path fits the group yet its multiplier is
    positive (a duality gap), the capacity DP (eq. N5) stays below the optimum and lifts the bound on some instances
    (with the rounded units of RMAX = 2 as well)."""
    monkeypatch.setattr(stage_dp, "MAX_STEPS", 40)
    slack = lifted = 0
    for seed in range(60):
        problem = random_problem(seed, num_groups=1, uniform=False, same_tp_first_last=False)
        brute = get_solver("brute")(problem, EXACT)
        if brute.status != "OPTIMAL":
            continue
        a = brute.assignment
        tau = _steady(problem, a)
        t = build_tables(problem, a.variant, tau)
        dp = PathDP(problem, t, tau, t.p_min, t.p_max)
        nb = node_bound(problem, t, tau, tau, t.p_min, t.p_max, None, None, dp)
        if nb.used is None or not math.isfinite(nb.bound_s) or not (nb.mu[0] > 0 and nb.used[0] <= dp.cap[0]):
            continue
        slack += 1
        cb, plan = capacity_bound(problem, dp, tau, nb.mu, 0)
        assert cb <= brute.objective_s * (1 + 1e-9), (seed, cb, brute.objective_s)
        assert plan is None or violations(problem, plan) == []  # a path within the group's GPUs is a plan
        lifted += cb > nb.bound_s * (1 + 1e-6)
    assert slack >= 3 and lifted >= 1, (slack, lifted)
