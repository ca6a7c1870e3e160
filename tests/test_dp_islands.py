"""Eq. DP8b (formulations/dp.md): on a several-island cluster the DP heuristic's second pass charges a link between
islands a share of its time on its sending stage's budget, so that pipelines across islands are found; every plan is
scored by ``evaluate`` and checked by ``violations``."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import large_problem, random_problem

from haap_milp.problem import evaluate, violations
from haap_milp.solvers import dp as dp_mod
from haap_milp.solvers import get_solver
from haap_milp.specs import SolveOptions

OPTS = SolveOptions(time_limit_s=60, threads=1)


def _islands(problem, a) -> set[str]:
    return {problem.groups[problem.options[s.option].group].rsplit("@", 1)[-1] for s in a.stages}


@pytest.mark.parametrize("seed", [1, 2])
def test_second_pass_finds_the_pipeline_across_islands(seed, monkeypatch):
    """Two islands of one GPU type each, a 0.11-0.15 s link between them (5-12.5 GB/s): with the whole link on the
    sending stage's budget (eq. DP2) every plan stays in one island; the second pass crosses and is >= 10 % faster."""
    problem = large_problem(seed, num_gpus=256, num_types=2, islands=2, num_layers=32, max_stages=16,
                            cross_island_gbps=(5.0, 12.5), micro_batches=(8,), gbs=512)
    monkeypatch.setattr(dp_mod, "CROSS_SHARE", 1.0)
    whole = get_solver("dp")(problem, OPTS)
    monkeypatch.setattr(dp_mod, "CROSS_SHARE", 0.25)
    shared = get_solver("dp")(problem, OPTS)
    for r in (whole, shared):
        assert violations(problem, r.assignment) == []
        assert r.objective_s == pytest.approx(evaluate(problem, r.assignment))
    assert len(_islands(problem, whole.assignment)) == 1
    assert len(_islands(problem, shared.assignment)) == 2
    assert shared.objective_s < 0.9 * whole.objective_s, (shared.objective_s, whole.objective_s)


def test_plans_stay_valid_and_above_the_optimum(monkeypatch):
    """Small random instances (every group its own island by name): each plan is valid and no better than brute
    force's optimum."""
    monkeypatch.setattr(dp_mod, "CROSS_SHARE", 0.25)
    exact = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)
    checked = 0
    for seed in range(25):
        problem = random_problem(seed)
        got = get_solver("dp")(problem, OPTS)
        if got.assignment is None:
            continue
        brute = get_solver("brute")(problem, exact)
        assert violations(problem, got.assignment) == []
        assert got.objective_s >= brute.objective_s * (1 - 1e-9)
        checked += 1
    assert checked >= 15, checked
