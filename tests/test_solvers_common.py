"""Shared solver machinery: slot tables, bounds, canonical hints, brute force, registry, generator."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import count_options, large_problem, random_problem

from haap_milp.errors import HaapInputError
from haap_milp.problem import Assignment, Stage, evaluate, stage_memory, violations
from haap_milp.solvers import SOLVERS, get_solver
from haap_milp.solvers.brute import compositions, plan_count
from haap_milp.solvers.common import build_tables, canonical, variant_bound
from haap_milp.specs import SolveOptions

SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow]}


@settings(max_examples=40, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_max_layers_match_stage_memory(seed):
    """U[k,o] layers fit at slot k and U+1 do not (eq. M2), checked with problem.stage_memory."""
    problem = random_problem(seed, max_stages=3)
    v = 0
    t = build_tables(problem, v)
    for k in range(1, t.K + 1):
        for i, o in enumerate(t.opts.tolist()):
            for first, table in ((False, t.U_mem), (True, t.Uf_mem)):
                u = int(table[k - 1, i])
                for n, fits in ((u, True), (u + 1, False)):
                    if n < 1 or n > problem.num_layers or (not fits and u == problem.num_layers):
                        continue
                    # a k-stage pipeline whose top stage is the probe (first) or whose k-th-from-end is
                    p = k + (0 if first else 1)
                    stages = [Stage(o, 1)] * p
                    stages[p - k] = Stage(o, n)
                    mem = stage_memory(problem, Assignment(v, tuple(stages)))[p - k]
                    cap = problem.variants[v].mem_capacity[o] * (1 + 1e-9)
                    assert (mem <= cap) == fits, (k, o, first, n, mem, cap)


@settings(max_examples=60, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_variant_bound_is_below_every_plan(seed):
    """Eq. B2 never exceeds the best plan of its variant (checked by brute force per variant)."""
    problem = random_problem(seed)
    for v in range(len(problem.variants)):
        sub = problem.__class__(**{**problem.__dict__, "variants": (problem.variants[v],)})
        brute = get_solver("brute")(sub)
        b = variant_bound(sub, build_tables(sub, 0))
        if brute.status == "OPTIMAL":
            assert b.total_s <= brute.objective_s * (1 + 1e-9)
            assert b.tau_lb <= max(_steady(sub, brute.assignment)) * (1 + 1e-9)
        elif math.isfinite(b.total_s):
            assert brute.status == "INFEASIBLE"


def _steady(problem, a):
    """The period tau of eq. T2 (as a one-element list)."""
    from haap_milp.pipeline import steady_period
    from haap_milp.problem import boundary_times, stage_times

    return [steady_period(stage_times(problem, a), boundary_times(problem, a),
                          problem.variants[a.variant].num_microbatches)]


@settings(max_examples=40, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_canonical_form_is_no_worse(seed):
    problem = random_problem(seed)
    dp = get_solver("dp")(problem)
    brute = get_solver("brute")(problem)
    for a in (dp.assignment, brute.assignment):
        if a is None:
            continue
        b = canonical(problem, build_tables(problem, a.variant), a)
        assert violations(problem, b) == []
        assert evaluate(problem, b) <= evaluate(problem, a) * (1 + 1e-12)


def test_brute_vectorised_equals_plain_enumeration():
    """The vectorised oracle agrees with a plain loop over evaluate/violations."""
    for seed in range(8):
        problem = random_problem(seed, num_layers=4, max_stages=2, max_options=4)
        best = math.inf
        for v in range(len(problem.variants)):
            for p in (1, 2):
                for opts in itertools.product(range(problem.num_options), repeat=p):
                    for comp in compositions(problem.num_layers, p):
                        a = Assignment(v, tuple(Stage(o, int(n)) for o, n in zip(opts, comp)))
                        if not violations(problem, a):
                            best = min(best, evaluate(problem, a))
        res = get_solver("brute")(problem)
        if math.isinf(best):
            assert res.status == "INFEASIBLE"
        else:
            assert res.objective_s == pytest.approx(best, rel=1e-12)
            assert res.stats["vectorised_objective_s"] == pytest.approx(best, rel=1e-12)


def test_brute_refuses_large_instances():
    problem = large_problem(0, num_gpus=64, num_types=2, num_layers=40, max_stages=8)
    assert plan_count(problem) > 3_000_000
    assert get_solver("brute")(problem).status == "ERROR"


def test_registry():
    assert {"cpsat", "milp", "dp", "brute"} <= set(SOLVERS)
    assert get_solver("auto") is SOLVERS["cpsat"]
    with pytest.raises(HaapInputError):
        get_solver("gurobi")


def test_large_generator_shapes():
    problem = large_problem(1, num_gpus=1024, num_types=3, num_layers=80)
    assert sum(problem.group_capacity) == 1024 and len(problem.groups) == 3
    assert all(50 <= n <= 400 for n in count_options(problem))
    small = random_problem(3)
    assert 2 <= len(small.groups) <= 4 and 4 <= small.num_layers <= 8


@pytest.mark.parametrize("name", ["cpsat", "milp"])
def test_time_limit_is_honoured(name):
    """A large instance with a 1 s limit returns a plan and a gap, not a hang."""
    problem = large_problem(2, num_gpus=1024, num_types=3, num_layers=80)
    opts = SolveOptions(time_limit_s=1.0, threads=2, relative_gap=0.0)
    dp = get_solver("dp")(problem, opts)
    t0 = time.perf_counter()
    res = get_solver(name)(problem, opts, hint=dp.assignment)
    wall = time.perf_counter() - t0
    assert wall < 4.0, wall  # model building is inside the limit; slack for the machine
    assert res.status in ("FEASIBLE", "OPTIMAL")
    assert violations(problem, res.assignment) == []
    assert res.objective_s <= dp.objective_s + 1e-9
    assert res.bound_s is not None and res.bound_s <= res.objective_s
    assert np.isfinite(res.bound_s)


def test_slot_table_memo_is_per_thread():
    """The slot tables' memory part is memoized per problem; a solve in another thread (another problem) must
    neither evict nor feed this thread's memo (it would hand one problem's tables to another)."""
    import threading

    from haap_milp.solvers.common import slot_bounds

    p1, p2 = random_problem(1, num_layers=6, max_stages=4), random_problem(2, num_layers=7, max_stages=4)
    mine = slot_bounds._memory_part(p1, 0)
    other = {}
    worker = threading.Thread(target=lambda: other.setdefault("t", slot_bounds._memory_part(p2, 0)))
    worker.start()
    worker.join()
    assert slot_bounds._memory_part(p1, 0) is mine  # not evicted by the other thread's problem
    assert other["t"]["L"] == p2.num_layers and mine["L"] == p1.num_layers


def test_a_failed_engine_run_is_said_once_and_the_proof_still_holds(monkeypatch):
    """An engine that raised on a node (fuzz report #1: CP-SAT's integers overflowed on a 1e-15 GB/s NIC) is said once
    in the message; the node goes back open with its earlier bound, so the result is still brute force's optimum with
    a valid bound (a proof where the search closed it)."""
    from haap_milp.solvers import cpsat

    real, failed = cpsat._solve_node, []

    def first_fails(*args, **kw):
        if not failed:
            failed.append(1)
            raise RuntimeError("engine broke")
        return real(*args, **kw)

    monkeypatch.setattr(cpsat, "_solve_node", first_fails)
    opts = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)
    for seed in range(20):
        failed.clear()
        res = get_solver("cpsat")(random_problem(seed, num_layers=6, max_stages=4), opts)
        if failed and res.assignment is not None:
            brute = get_solver("brute")(random_problem(seed, num_layers=6, max_stages=4), opts)
            assert res.message.count("engine broke") == 1, (seed, res.status, res.message)
            assert res.bound_s <= brute.objective_s * (1 + 1e-9) + 1e-9
            assert res.status == "OPTIMAL" and res.objective_s == pytest.approx(brute.objective_s, rel=1e-6)
            return
    pytest.fail("no seed ran the engine")
