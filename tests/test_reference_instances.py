"""formulations/instances/<name>/: CP-SAT, MILP and brute force reach the stored optimum of each
spec-level reference instance (catalog model, cluster and training; optimum found by brute force on
the presolved problem), the heuristics (dp, uniform) never beat it, and the user path
``planner.solve`` returns a checked plan at that optimum.

These optima come from presolve + the estimator, so they move with calibration.json (rerun
formulations/instances/regenerate.py and review the diff of expected.json), and they do not check
presolve independently. The calibration-independent checks are the pinned Problem-level instances
(tests/test_pinned_instances.py) and the spec-level oracle (tests/test_spec_oracle.py)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from haap_milp import planner
from haap_milp.problem import evaluate, violations

ROOT = pathlib.Path(__file__).parent.parent / "formulations" / "instances"
CASES = sorted(p for p in ROOT.iterdir() if (p / "instance.yaml").exists())
_spec = importlib.util.spec_from_file_location("regenerate", ROOT / "regenerate.py")
regenerate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regenerate)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_solvers_reach_the_stored_optimum(case):
    expected = json.loads((case / "expected.json").read_text())
    model, cluster, training, options = regenerate.load(case)
    ctx = planner.Context.build(model, cluster, training, options)
    brute, _ = planner.run_method(ctx, "brute")
    assert brute.status == expected["status"] == "OPTIMAL"
    assert brute.objective_s == pytest.approx(expected["objective_s"], rel=1e-9)
    for method in ("cpsat", "milp"):
        raw, _ = planner.run_method(ctx, method)
        assert raw.status == "OPTIMAL", (method, raw.message)
        assert violations(ctx.presolved.problem, raw.assignment) == []
        assert evaluate(ctx.presolved.problem, raw.assignment) == pytest.approx(expected["objective_s"], rel=2e-4)
    for method in ("dp", "uniform"):
        raw, _ = planner.run_method(ctx, method)
        assert raw.status == "FEASIBLE", (method, raw.message)
        assert violations(ctx.presolved.problem, raw.assignment) == []
        assert raw.objective_s >= expected["objective_s"] * (1 - 1e-9), method


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_user_path_reaches_the_stored_optimum(case):
    expected = json.loads((case / "expected.json").read_text())
    model, cluster, training, options = regenerate.load(case)
    out = planner.solve(model, cluster, training, options)
    assert out.result.status.value == "OPTIMAL", out.result.message
    assert out.violations == []
    assert out.estimate.iteration_time_s == pytest.approx(expected["objective_s"], rel=2e-4)
    assert out.result.plan.samples_per_microbatch in regenerate.load(case)[3].micro_batch_sizes


def test_there_are_reference_instances():
    assert len(CASES) >= 3
