"""Pinned Problem-level reference instances (formulations/instances/problems/*.json): every cost array
is written out, so the stored brute-force optimum depends on neither the estimator nor calibration.json.

Every registered solver runs on each: exact ones (cpsat, milp) reach the optimum within their stated
tolerance, heuristics (dp, uniform) return feasible plans never better than it, uniform equals a brute
force over its own search space (same signature, even split, any group per stage), and each instance
still has the property it was chosen for (T2 round trip binds, T3 sync moves the optimum, memory binds,
uniform rule binds, infeasible)."""

from __future__ import annotations

import pathlib
import sys
from dataclasses import replace

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from problem_io import PINNED, assignment_from_dict, even_split_uniform_optimum, load_pinned

from haap_milp.pipeline import exposed_sync
from haap_milp.problem import boundary_times, evaluate, stage_memory, stage_times, sync_times, violations
from haap_milp.solvers import SOLVERS, get_solver
from haap_milp.specs import SolveOptions

OPTS = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)
CASES = sorted(PINNED.glob("*.json"))
IDS = [c.stem for c in CASES]
EXACT = ("cpsat", "milp", "brute")
HEURISTIC = ("dp", "uniform")


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def case(request):
    return load_pinned(request.param)


def test_registry_is_covered():
    assert set(SOLVERS) == set(EXACT) | set(HEURISTIC), "a new solver must be added to this file"
    assert {"t2-round-trip", "t3-sync", "memory-bound", "uniform-target", "infeasible-memory"} <= set(IDS)


def test_stored_optimum_is_consistent(case):
    problem, doc = case
    opt = doc["optimum"]
    a = assignment_from_dict(opt["assignment"])
    if opt["status"] == "INFEASIBLE":
        assert a is None and opt["objective_s"] is None
        return
    assert opt["status"] == "OPTIMAL"
    assert violations(problem, a) == []
    assert evaluate(problem, a) == pytest.approx(opt["objective_s"], rel=1e-12)


@pytest.mark.parametrize("method", EXACT)
def test_exact_solvers_reach_the_pinned_optimum(case, method):
    problem, doc = case
    opt = doc["optimum"]
    res = get_solver(method)(problem, OPTS)
    assert res.status == opt["status"], (method, res.status, res.message)
    if opt["status"] == "INFEASIBLE":
        assert res.assignment is None and res.message
        return
    assert violations(problem, res.assignment) == []
    obj = evaluate(problem, res.assignment)
    assert res.objective_s == pytest.approx(obj, rel=1e-3)
    tol = res.stats.get("tolerance_s", 0.0) + 1e-9 * opt["objective_s"]
    assert opt["objective_s"] * (1 - 1e-9) <= obj <= opt["objective_s"] + tol, method
    assert res.bound_s is not None and res.bound_s <= opt["objective_s"] * (1 + 1e-9)


@pytest.mark.parametrize("method", HEURISTIC)
def test_heuristics_are_feasible_and_never_better(case, method):
    problem, doc = case
    opt = doc["optimum"]
    res = get_solver(method)(problem, OPTS)
    if opt["status"] == "INFEASIBLE":
        assert res.status in ("INFEASIBLE", "NO_SOLUTION") and res.assignment is None
        return
    if method == "uniform" and doc["even_split_uniform_optimum_s"] is None:
        assert res.assignment is None
        return
    assert res.status == "FEASIBLE", (method, res.message)
    assert violations(problem, res.assignment) == []
    assert res.objective_s == pytest.approx(evaluate(problem, res.assignment), rel=1e-9)
    assert res.objective_s >= opt["objective_s"] * (1 - 1e-12)


def test_uniform_equals_brute_force_over_its_search_space(case):
    problem, doc = case
    want = doc["even_split_uniform_optimum_s"]
    got = even_split_uniform_optimum(problem)
    assert (got is None) == (want is None) and (want is None or got == pytest.approx(want, rel=1e-12))
    res = get_solver("uniform")(problem, OPTS)
    if want is None:
        assert res.status == "INFEASIBLE"
        return
    assert res.objective_s == pytest.approx(want, rel=1e-9)
    opts = [problem.options[s.option] for s in res.assignment.stages]
    assert len({o.signature for o in opts}) == 1
    assert len({s.num_layers for s in res.assignment.stages}) == 1
    # the uniform rule as a constraint (any split) can only do better than the even split
    uni = get_solver("brute")(replace(problem, uniform=True), OPTS)
    assert uni.objective_s <= want * (1 + 1e-12)


def _pinned(name):
    problem, doc = load_pinned(PINNED / f"{name}.json")
    return problem, doc, assignment_from_dict(doc["optimum"]["assignment"])


def test_t2_round_trip_binds_at_the_optimum():
    problem, doc, a = _pinned("t2-round-trip")
    t, c = stage_times(problem, a), boundary_times(problem, a)
    m, p = problem.variants[a.variant].num_microbatches, len(t)
    plain = max(max(t), max(c, default=0.0) / 2)
    # every window of stages j..k (P - j < M), summed by slicing: k = P-1 is the in-flight round trip
    trip = max((sum(t[j:k + 1]) + sum(c[j:k])) / (k - j + 1) for j in range(p) if p - j < m for k in range(j, p))
    assert trip > 1.05 * plain
    sigma = exposed_sync(t, sync_times(problem, a))
    assert doc["optimum"]["objective_s"] == pytest.approx((m - 1) * trip + sum(t) + sum(c) + sigma, rel=1e-12)


def test_t3_sync_moves_the_optimum():
    problem, doc, a = _pinned("t3-sync")
    zero = [replace(v, sync_fixed=0 * v.sync_fixed, sync_per_layer=0 * v.sync_per_layer,
                    sync_first=0 * v.sync_first, sync_last=0 * v.sync_last) for v in problem.variants]
    free = get_solver("brute")(replace(problem, variants=tuple(zero)), OPTS)
    assert free.assignment != a
    sigma = exposed_sync(stage_times(problem, a), sync_times(problem, a))
    assert sigma > 0.05 * doc["optimum"]["objective_s"]
    assert len(a.stages) >= 2  # the stagger term beta * sum_{k<j} t_k is in play


def test_memory_binds():
    problem, doc, a = _pinned("memory-bound")
    var = problem.variants[a.variant]
    fill = max(m / var.mem_capacity[s.option] for m, s in zip(stage_memory(problem, a), a.stages))
    assert 0.9 < fill <= 1 + 1e-9
    roomy = replace(problem, variants=tuple(replace(v, mem_capacity=100 * v.mem_capacity) for v in problem.variants))
    assert get_solver("brute")(roomy, OPTS).objective_s < 0.95 * doc["optimum"]["objective_s"]


def test_uniform_rule_binds():
    problem, doc, a = _pinned("uniform-target")
    assert problem.uniform
    assert len({problem.options[s.option].signature for s in a.stages}) == 1
    free = get_solver("brute")(replace(problem, uniform=False), OPTS)
    assert free.objective_s < 0.99 * doc["optimum"]["objective_s"]
    # here the uniform optimum is an even split, so the uniform baseline must find it exactly
    assert get_solver("uniform")(problem, OPTS).objective_s == pytest.approx(doc["optimum"]["objective_s"], rel=1e-9)


def test_infeasible_only_because_of_memory():
    problem, doc, _ = _pinned("infeasible-memory")
    assert doc["optimum"]["status"] == "INFEASIBLE"
    assert any(v.allowed.any() for v in problem.variants)  # not trivially empty
    roomy = replace(problem, variants=tuple(replace(v, mem_capacity=100 * v.mem_capacity) for v in problem.variants))
    assert get_solver("brute")(roomy, OPTS).status == "OPTIMAL"
