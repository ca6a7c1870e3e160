"""Eq. N21: CP-SAT and HiGHS racing on a node (solvers/common/race.py, cpsat._race_node, cpsat._merge)."""

from __future__ import annotations

import os
import pathlib
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from forked import gone, needs_fork, refuse_fork
from synthetic import random_problem

from haap_milp import worker
from haap_milp.deadline import Deadline
from haap_milp.problem import evaluate
from haap_milp.solvers import cpsat, get_solver
from haap_milp.solvers.common import VariantResult, branch_and_bound, highs_node
from haap_milp.solvers.common import race as race_mod
from haap_milp.solvers.common.lp import highspy, run
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=2, seed=0)
SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow]}


def _waiter(log: list, name: str, register_after_s: float = 0.0):
    """A racer that runs until stopped (at most 10 s), registering its stop after ``register_after_s``."""

    def racer(r):
        time.sleep(register_after_s)
        stopped = threading.Event()
        with r.stopper(stopped.set):
            stopped.wait(10.0)
        log.append((name, stopped.is_set()))
        return "stopped" if stopped.is_set() else "timed out"

    return racer


def _quick(result: str, after_s: float = 0.0):
    def racer(r):
        time.sleep(after_s)
        return result

    return racer


@pytest.mark.parametrize("fast_here", [True, False])
def test_the_first_to_finish_stops_the_other(fast_here):
    log: list = []
    fast, slow = _quick("done", 0.05), _waiter(log, "slow")
    t0 = time.perf_counter()
    here, there = (fast, slow) if fast_here else (slow, fast)
    a, b = race_mod.race(here, there, done=lambda x: x == "done", failed=repr)
    assert time.perf_counter() - t0 < 5.0
    assert {a, b} == {"done", "stopped"} and log == [("slow", True)]


@pytest.mark.parametrize("fast_here", [True, False])
def test_a_stop_sent_before_the_loser_registers_is_sent_again(fast_here):
    """The loser registers its stop only after the winner has returned: the race keeps stopping until it returns."""
    log: list = []
    fast, slow = _quick("done"), _waiter(log, "slow", register_after_s=0.2)
    here, there = (fast, slow) if fast_here else (slow, fast)
    t0 = time.perf_counter()
    out = race_mod.race(here, there, done=lambda x: x == "done", failed=repr)
    assert time.perf_counter() - t0 < 5.0 and log == [("slow", True)] and "done" in out


def test_an_unfinished_result_here_leaves_the_other_its_time_and_a_failure_is_a_result():
    def broken(r):
        raise RuntimeError("engine failed")

    a, b = race_mod.race(broken, _quick("done", 0.1), done=lambda x: x == "done", failed=lambda e: f"failed: {e}")
    assert (a, b) == ("failed: engine failed", "done")
    a, b = race_mod.race(_quick("timed out"), _quick("late", 0.1), done=lambda x: x == "done", failed=repr)
    assert (a, b) == ("timed out", "late")  # not stopped: 'late' ran to its own end


def test_an_interrupt_here_stops_the_other():
    log: list = []

    def interrupted(r):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        race_mod.race(interrupted, _waiter(log, "other"), done=lambda x: x == "done", failed=repr)
    assert log == [("other", True)]


@pytest.mark.skipif(highspy is None, reason="highspy not installed")
def test_highs_runs_on_two_threads_with_their_own_thread_counts():
    """HiGHS keeps its scheduler per calling thread: an LP here with 2 threads, a MIP on the race's helper thread with
    1, and the LP again here each solve (a shared bookkeeping reset the scheduler each time or left 'Not Set')."""

    def lp(threads: int, integer: bool) -> str:
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", threads)
        n = 12
        h.addVars(n, np.zeros(n), np.full(n, 9.0))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), -np.arange(1.0, n + 1))
        if integer:
            h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, highspy.HighsVarType.kInteger))
        h.addRow(-highspy.kHighsInf, 41.5, n, np.arange(n, dtype=np.int32), 1.3 * np.arange(1.0, n + 1))
        run(h)
        return h.modelStatusToString(h.getModelStatus())

    assert lp(2, False) == "Optimal"
    assert race_mod._helper().submit(lp, 1, True).result() == "Optimal"
    assert lp(2, False) == "Optimal"
    assert race_mod._helper().submit(lp, 1, True).result() == "Optimal"


def _result(status, a=None, bound=None, tol=0.0):
    return VariantResult(status, a, bound, {"tolerance_s": tol})


def test_merge_keeps_the_finisher_and_the_higher_bound():
    problem = random_problem(4, num_layers=6, max_stages=3, num_variants=2)
    brute = get_solver("brute")(problem, EXACT)
    a = brute.assignment
    # the finisher's status and plan, the higher bound, the larger tolerance
    m = cpsat._merge(problem, _result("OPTIMAL", a=a, bound=1.0, tol=1e-6), _result("NO_SOLUTION", bound=1.5, tol=1e-9))
    assert (m.status, m.assignment, m.bound_s, m.stats["tolerance_s"], m.stats["race"]) == ("OPTIMAL", a, 1.5, 1e-6,
                                                                                            "cpsat")
    # INFEASIBLE wins and drops the bound, the other's plan still offered
    m = cpsat._merge(problem, _result("FEASIBLE", a=a, bound=0.5), _result("INFEASIBLE"))
    assert (m.status, m.assignment, m.bound_s, m.stats["race"]) == ("INFEASIBLE", a, None, "highs")
    # neither finished: FEASIBLE with a plan, else NO_SOLUTION; an ERROR racer is left out unless both failed
    m = cpsat._merge(problem, _result("ERROR"), _result("NO_SOLUTION", bound=0.7))
    assert (m.status, m.bound_s, m.stats["race"]) == ("NO_SOLUTION", 0.7, "none")
    assert cpsat._merge(problem, _result("ERROR"), _result("ERROR")).status == "ERROR"


def test_merge_takes_the_other_plan_only_when_it_is_lower():
    for seed in range(60):  # an instance whose uniform plan is slower than its optimum
        problem = random_problem(seed)
        brute = get_solver("brute")(problem, EXACT)
        worse = get_solver("uniform")(problem, EXACT).assignment
        if brute.status == "OPTIMAL" and worse is not None and evaluate(problem, worse) > brute.objective_s * 1.01:
            break
    else:
        pytest.fail("no instance with a slower uniform plan")
    best = brute.assignment
    m = cpsat._merge(problem, _result("OPTIMAL", a=worse), _result("FEASIBLE", a=best))
    assert m.assignment == best and m.status == "OPTIMAL"
    m = cpsat._merge(problem, _result("OPTIMAL", a=best), _result("FEASIBLE", a=worse))
    assert m.assignment == best
    same = type(best)(best.variant, tuple(best.stages))  # a tie: the finisher's plan, whichever racer finished
    m = cpsat._merge(problem, _result("FEASIBLE", a=same), _result("OPTIMAL", a=best))
    assert m.assignment is best


@settings(max_examples=25, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_the_race_on_every_node_matches_brute_force(seed, monkeypatch_module):
    """Every node model raced (RACE_MIN_VARS = 0; HiGHS on a forked child, eq. N21b): the same optimum as brute force,
    a valid bound."""
    problem = random_problem(seed)
    brute = get_solver("brute")(problem, EXACT)
    races = []
    real = cpsat.race
    with monkeypatch_module.context() as mp:
        mp.setattr(cpsat, "RACE_MIN_VARS", 0)
        mp.setattr(highs_node, "_lingered", worker.available())  # (eq. N21b: HiGHS on a forked child where it can be)
        mp.setattr(cpsat, "race", lambda *a, **k: races.append(1) or real(*a, **k))
        res = cpsat.solve(problem, EXACT)
    assert res.status == brute.status, (res.status, brute.status, res.message)
    if brute.status == "OPTIMAL":
        tol = res.stats.get("tolerance_s", 0.0) + 1e-9
        assert abs(res.objective_s - brute.objective_s) <= tol + 1e-6 * brute.objective_s
        assert res.bound_s <= brute.objective_s + tol
    engines = [v for k, v in res.stats.items() if k.startswith("engine") and k[6:].isdigit()]
    here = [v for v in engines if not v.endswith("(worker)")]  # (eq. PAR2's workers race in their own process)
    assert len(races) == len(here) and len(engines) == sum(v for k, v in res.stats.items() if k.startswith("race_"))


@settings(max_examples=6, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_the_race_on_a_helper_thread_matches_brute_force(seed, monkeypatch_module):
    """Eq. N21 as before eq. N21b (HiGHS on the race's helper thread: no fork, or FORK_RACER off): brute force's optimum."""
    problem = random_problem(seed)
    brute = get_solver("brute")(problem, EXACT)
    with monkeypatch_module.context() as mp:
        mp.setattr(cpsat, "RACE_MIN_VARS", 0)
        mp.setattr(cpsat, "FORK_RACER", False)
        mp.setattr(highs_node, "fork_racer", lambda *a: pytest.fail("forked with FORK_RACER off"))
        res = cpsat.solve(problem, EXACT)
    assert res.status == brute.status
    if brute.status == "OPTIMAL":
        assert abs(res.objective_s - brute.objective_s) <= res.stats.get("tolerance_s", 0.0) + 1e-6 * brute.objective_s


def _stubborn_highs(*_args, **_kwargs):
    """A HiGHS racer that never looks at its stop flag (HiGHS' root node between two checks, for 30 s)."""
    time.sleep(30)
    return VariantResult("NO_SOLUTION", stats={"backend": "highs"})


@needs_fork
def test_a_forked_racer_that_ignores_its_stop_is_killed_when_cpsat_finishes(monkeypatch):
    """Eq. N21b: CP-SAT closes each node; the HiGHS racer, deaf to its stop, is killed at once, so the solve takes
    seconds, not 30 s a node (on the helper thread the race waited for it), and finds brute force's optimum."""
    problem = random_problem(7)
    brute = get_solver("brute")(problem, EXACT)
    monkeypatch.setattr(cpsat, "RACE_MIN_VARS", 0)
    monkeypatch.setattr(branch_and_bound, "POOL_SIZE", 1)  # (PAR2's workers off: the races run here, seen here)
    monkeypatch.setattr(highs_node, "_lingered", True)  # (as after a first wait of more than LINGER_S)
    monkeypatch.setattr(highs_node, "highs_node", _stubborn_highs)  # (the child, forked after this, runs it)
    t0 = time.perf_counter()
    res = cpsat.solve(problem, EXACT)
    assert time.perf_counter() - t0 < 20.0
    assert res.status == brute.status == "OPTIMAL"
    assert abs(res.objective_s - brute.objective_s) <= res.stats.get("tolerance_s", 0.0) + 1e-6 * brute.objective_s
    assert any(k.startswith("race_") for k in res.stats)


@needs_fork
def test_a_race_that_waits_for_highs_past_linger_s_makes_the_process_fork_its_racers(monkeypatch):
    """Eq. N21b: HiGHS on the helper thread going on 0.6 s past CP-SAT's finish (more than LINGER_S) switches this
    process to forked racers; before that none is forked (the fork's cost where HiGHS stops when told)."""
    problem = random_problem(7)
    forked = []
    real_fork_racer = highs_node.fork_racer

    def counted(*args):  # (the racers forked; fork_map's children are not racers)
        child = real_fork_racer(*args)
        if child is not None:
            forked.append(1)
        return child

    def slow_highs(*_args, **_kwargs):  # (a forked racer: killed at the race's end)
        time.sleep(0.6)
        return VariantResult("NO_SOLUTION", stats={"backend": "highs"})

    def lingering(*args):  # (on the helper thread: goes on 0.6 s past the stop, however late CP-SAT finishes)
        r, end = args[-1], time.monotonic() + args[3]
        while not r.interrupted and time.monotonic() < end:
            time.sleep(0.01)
        return slow_highs()

    monkeypatch.setattr(cpsat, "RACE_MIN_VARS", 0)
    monkeypatch.setattr(branch_and_bound, "POOL_SIZE", 1)  # (PAR2's workers off: a worker's linger is its own)
    monkeypatch.setattr(highs_node, "_lingered", False)
    monkeypatch.setattr(highs_node, "highs_node", slow_highs)
    monkeypatch.setattr(cpsat, "race_node", lingering)
    monkeypatch.setattr(cpsat, "fork_racer", counted)
    assert highs_node.fork_racer(problem, None, None, 1.0, None, EXACT) is None and not forked
    assert cpsat.solve(problem, EXACT).status == "OPTIMAL" and highs_node._lingered
    before = len(forked)  # (its races after the first wait forked)
    assert cpsat.solve(problem, EXACT).status == "OPTIMAL" and len(forked) > before


@needs_fork
def test_await_racer_kills_the_child_at_the_race_end_and_past_its_time():
    r = Deadline(None)
    child = worker.start(lambda: time.sleep(30))
    threading.Timer(0.1, r.interrupt).start()
    t0 = time.perf_counter()
    got = highs_node.await_racer(child, 30.0, r, Deadline(None))
    assert time.perf_counter() - t0 < 2.0 and got.status == "NO_SOLUTION" and got.stats["racer_killed"] == 1
    assert gone(child.pid)
    child = worker.start(lambda: time.sleep(30))  # its own time (0.1 s) and KILL_SLACK_S past: killed
    t0 = time.perf_counter()
    got = highs_node.await_racer(child, 0.1, Deadline(None), Deadline(None))
    assert time.perf_counter() - t0 < 0.1 + highs_node.KILL_SLACK_S + 1.0 and got.status == "NO_SOLUTION"
    assert gone(child.pid)


@needs_fork
def test_await_racer_returns_the_childs_result_and_raises_its_error():
    done = VariantResult("INFEASIBLE", stats={"backend": "highs"})
    child = worker.start(lambda: done)
    assert highs_node.await_racer(child, 5.0, Deadline(None), Deadline(None)) == done and gone(child.pid)

    def broken():
        raise RuntimeError("HiGHS failed")

    with pytest.raises(RuntimeError, match="HiGHS failed"):
        highs_node.await_racer(worker.start(broken), 5.0, Deadline(None), Deadline(None))


def test_worker_start_without_fork_gives_none(monkeypatch):
    monkeypatch.setattr(os, "fork", refuse_fork)
    assert worker.start(lambda: 1) is None
    monkeypatch.setattr(worker, "available", lambda: False)
    assert worker.start(lambda: 1) is None


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()
