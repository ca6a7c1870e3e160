"""formulations/instances: CP-SAT, MILP and brute force reach the stored optimum of each reference
instance (catalog model, cluster and training; optimum found by exhaustive enumeration).

A change of the cost model moves these optima: rerun formulations/instances/regenerate.py and review
the diff of expected.json."""

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
    dp, _ = planner.run_method(ctx, "dp")
    assert dp.objective_s >= expected["objective_s"] * (1 - 1e-9)


def test_there_are_reference_instances():
    assert len(CASES) >= 3
