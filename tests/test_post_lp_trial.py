"""Eq. N17e (formulations/README.md): after the LP has left a node open, the bound-only DPs (eqs. N15, N6, N5) of the
node's full pass stop for the rest of the search after POST_LP_TRIAL such passes in a row in which they neither lifted
the node's bound above its LP nor gave a better plan. Dropping a bound never makes the search inexact: checked against
brute force with the trial at 0 (never), 1 (the default) and unbounded (always), every node model treated as large so
that the LP and the full pass run."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import all_models_large, random_problem, solve_against_brute

from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)


def _solve_all(seeds) -> list[dict]:
    """Each seed's problem solved by CP-SAT's search and brute force (the same status and optimum, a valid bound): the
    stats of those with an optimum."""
    out = []
    for seed in seeds:
        problem = random_problem(seed, num_groups=2 + seed % 2, num_layers=6 + seed % 3, max_stages=4, max_options=6)
        res = solve_against_brute(problem, "cpsat", EXACT, seed)
        if res is not None:
            out.append(res.stats)
    return out


@pytest.mark.parametrize("trial", [0, 1, 10**9])
def test_the_search_matches_brute_force_whatever_the_trial(trial, monkeypatch):
    """Fails if leaving the bound-only DPs out closed a node (e.g. a skipped DP returning a bound it did not prove)."""
    monkeypatch.setattr(bb, "POST_LP_TRIAL", trial)
    all_models_large(monkeypatch)
    stats = _solve_all(range(16))
    assert len(stats) >= 8
    passes = sum(s.get("post_lp_bounds", 0) for s in stats)
    if trial == 0:
        assert passes == 0  # (never run after the LP)
    else:
        assert passes > 0


def test_the_trial_stops_the_bound_dps_after_a_pass_without_a_win(monkeypatch):
    """With POST_LP_TRIAL = 1 (one process: ``threads`` 1) every pass but the first follows a win, so passes <= wins +
    1 in each search; unbounded, some search runs more passes than that (the rule has something to stop)."""
    all_models_large(monkeypatch)
    monkeypatch.setattr(bb, "POST_LP_TRIAL", 10**9)
    free = _solve_all(range(16))
    assert any(s.get("post_lp_bounds", 0) > s.get("post_lp_bound_wins", 0) + 1 for s in free), free
    monkeypatch.setattr(bb, "POST_LP_TRIAL", 1)
    for s in _solve_all(range(16)):
        assert s.get("post_lp_bounds", 0) <= s.get("post_lp_bound_wins", 0) + 1, s
