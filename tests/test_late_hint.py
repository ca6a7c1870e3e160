"""Eq. PAR4: the DP heuristic on a worker process beside the exact search (``solvers/common/late_hint.py``,
``planner._dp_beside``).

The feed itself: a plan taken once, renumbered for a restricted problem, a failure and a run past its wait reported.
The search: a plan arriving mid-search becomes the incumbent, the node workers wait for it, and the exact optimum is
brute force's. The planner: the DP's result is reported as if it had run first, a DP plan better than the search's
is the one returned, and Ctrl-C does not wait for the DP.
"""

from __future__ import annotations

import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from forked import EXACT, needs_fork
from forked import gone as _gone
from synthetic import assert_exact_solvers_match_brute, large_problem, random_problem

from haap_milp import planner, worker
from haap_milp.catalog import load_cluster, load_model
from haap_milp.deadline import Deadline
from haap_milp.problem import Assignment, RawResult, Stage, evaluate
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.solvers.common import late_hint
from haap_milp.specs import SolveOptions, TrainingSpec

pytestmark = needs_fork


def _plan(variant: int) -> Assignment:
    return Assignment(variant=variant, stages=(Stage(option=0, num_layers=4),))


def _raw(variant: int = 2, objective: float = 3.0) -> RawResult:
    return RawResult("FEASIBLE", "dp", assignment=_plan(variant), objective_s=objective)


def _slow_raw() -> RawResult:
    time.sleep(30)
    return _raw()


def _failing() -> RawResult:
    raise ValueError("dp broke")


def _until_interrupted(d: Deadline) -> RawResult:
    while not d.interrupted:
        time.sleep(0.01)
    return _raw(objective=7.0)


def _wait_back_pipe(feed: late_hint.Beside) -> None:
    """Until the child's reply is in the pipe, not read (``pending`` would read it)."""
    end = time.monotonic() + 20
    while not feed._worker.conn.poll(0.01) and time.monotonic() < end:
        pass


def _wait_back(feed: late_hint.Beside) -> None:
    end = time.monotonic() + 20
    while feed.pending and time.monotonic() < end:
        time.sleep(0.01)


def test_beside_gives_its_plan_once_then_its_result():
    feed = late_hint.Beside(_raw)
    _wait_back(feed)
    assert not feed.pending
    assert feed.take() == _plan(2)
    assert feed.take() is None  # (taken once)
    got = feed.result(0.0)
    assert isinstance(got, RawResult) and got.objective_s == 3.0
    assert _gone(feed._worker.pid)


def test_a_failing_heuristic_comes_back_as_its_exception():
    feed = late_hint.Beside(_failing)
    _wait_back(feed)
    assert feed.take() is None
    assert isinstance(feed.result(0.0), ValueError)


def test_a_heuristic_not_back_in_time_is_killed():
    feed = late_hint.Beside(_slow_raw)
    assert feed.pending and feed.take() is None
    t0 = time.monotonic()
    assert feed.result(0.2) is None
    assert time.monotonic() - t0 < 5.0
    assert _gone(feed._worker.pid)


def test_mapped_renumbers_for_the_kept_variants():
    feed = late_hint.Beside(_raw)
    _wait_back(feed)
    assert late_hint.Mapped(feed, [0, 2, 5]).take() == _plan(1)
    feed = late_hint.Beside(_raw)
    _wait_back(feed)
    assert late_hint.Mapped(feed, [0, 1]).take() is None  # its variant left out of the restricted problem
    feed.close()


class _Fixed(late_hint.Feed):
    """A plan that 'arrives' after ``after`` polls (a deterministic stand-in for the worker)."""

    def __init__(self, plan, after: int) -> None:
        self.plan, self.after, self.polls = plan, after, 0

    @property
    def pending(self) -> bool:
        return self.polls < self.after

    def take(self):
        self.polls += 1
        if self.polls == self.after:
            return self.plan
        return None


@pytest.mark.parametrize("seed", range(4))
def test_a_plan_arriving_mid_search_is_taken_and_the_optimum_stays_brute_forces(monkeypatch, seed):
    """The brute-force optimum fed late (after three polls) is the search's incumbent; the search still proves it."""
    monkeypatch.setattr(bb, "POOL_AFTER_S", 0.0)
    problem = random_problem(400 + seed, num_layers=8, max_stages=4, max_options=6)
    brute = get_solver("brute")(problem, EXACT)
    best, best_a = brute.objective_s, brute.assignment
    feed = _Fixed(best_a, after=3)
    with late_hint.feeding(feed):
        res = get_solver("cpsat")(problem, EXACT)
    assert res.status == "OPTIMAL" and res.objective_s == pytest.approx(best, rel=1e-6)
    assert res.stats.get("late_hint_objective_s") == pytest.approx(evaluate(problem, best_a), rel=1e-9)
    with late_hint.feeding(_Fixed(best_a, after=10**9)):  # (never arrives: the search still ends right)
        assert_exact_solvers_match_brute(problem, EXACT)


def test_workers_wait_for_the_late_plan(monkeypatch):
    """While the DP's plan is still to come the search runs its nodes here (two processes on two cores, not three).
    (The problem: eight open nodes from the start, each solve 0.2-1 CPU s; test_node_pool.py's ``_split_problem``.)"""
    monkeypatch.setattr(bb, "POOL_AFTER_S", 0.0)
    monkeypatch.setattr(worker, "cpus", lambda: 2)
    problem = large_problem(1, num_gpus=256, num_types=3, num_layers=8, max_stages=4, micro_batches=(8, 16))
    with late_hint.feeding(_Fixed(None, after=10**9)):
        res = get_solver("cpsat")(problem, EXACT)
    assert res.status == "OPTIMAL" and "node_workers" not in res.stats
    with late_hint.feeding(_Fixed(None, after=2)):
        res = get_solver("cpsat")(problem, EXACT)
    assert res.status == "OPTIMAL" and res.stats.get("node_workers") == 2


SMALL = ("gpt3-1.3b", "a100-80g:8@ib,a100-80g:8@roce", TrainingSpec(global_batch_size=32, seq_len=2048))


def _solve(monkeypatch, beside: bool, cluster: str = SMALL[1], threads: int = 2):
    monkeypatch.setattr(planner, "DP_BESIDE", beside)
    monkeypatch.setattr(worker, "cpus", lambda: 2)
    name, _, training = SMALL
    options = SolveOptions(time_limit_s=30, threads=threads, relative_gap=1e-4, max_stages=6)
    return planner.solve(load_model(name), load_cluster(cluster), training, options).result


def _exact_hints(monkeypatch) -> list:
    """The solver of the warm start each exact run in this process starts from (run_method's hint)."""
    seen, inner = [], planner.run_method

    def recorded(ctx, method, hint_raw=None):
        if hint_raw is not None:
            seen.append(hint_raw.solver)
        return inner(ctx, method, hint_raw)

    monkeypatch.setattr(planner, "run_method", recorded)
    return seen


def test_planner_runs_the_dp_beside_and_reports_it(monkeypatch):
    """One GPU type: the same proven optimum with the DP beside the search as after it; the search started from the
    uniform baseline's plan, and the DP's is reported either way."""
    first = _solve(monkeypatch, beside=False)
    hints = _exact_hints(monkeypatch)
    side = _solve(monkeypatch, beside=True)
    assert hints == ["uniform"]
    assert first.status == side.status == planner.Status.OPTIMAL
    assert side.objective_s == pytest.approx(first.objective_s, rel=2e-4)
    assert side.stats["dp_objective_s"] == pytest.approx(first.stats["dp_objective_s"], rel=1e-9)
    assert side.stats["dp_beside"] == 1 and "dp_beside" not in first.stats


@pytest.mark.parametrize(("cluster", "threads"), [(SMALL[1], 1), ("a100-80g:8,a100-40g:8", 2)])
def test_the_dp_runs_first_with_one_thread_or_several_gpu_types(monkeypatch, cluster, threads):
    res = _solve(monkeypatch, beside=True, cluster=cluster, threads=threads)
    assert "dp_beside" not in res.stats and "dp_objective_s" in res.stats


def test_no_dp_beside_without_a_warm_start(monkeypatch):
    monkeypatch.setattr(planner, "DP_BESIDE", True)
    name, cluster, training = SMALL
    options = SolveOptions(time_limit_s=30, threads=2, relative_gap=1e-4, max_stages=6, warm_start=False)
    res = planner.solve(load_model(name), load_cluster(cluster), training, options).result
    assert "dp_beside" not in res.stats and "dp_objective_s" in res.stats


def test_a_better_dp_plan_replaces_the_search_s():
    """The DP's plan is better than the search's (it came back after the search stopped): it is returned with the
    search's bound, proven where it lies within the gap of it; a search without a plan returns the DP's."""
    from types import SimpleNamespace

    ctx = SimpleNamespace(options=SolveOptions(relative_gap=0.01))
    searched = RawResult("FEASIBLE", "cpsat", assignment=_plan(0), objective_s=5.0, bound_s=2.9,
                         message="gap 42.00% when the time limit was reached")
    out = planner._with_late(ctx, searched, _raw(objective=3.0))
    assert (out.assignment, out.objective_s, out.bound_s, out.status) == (_plan(2), 3.0, 2.9, "FEASIBLE")
    assert out.message == "gap 3.33% when the time limit was reached" and out.stats["late_dp_plan"] == 1
    close = RawResult("FEASIBLE", "cpsat", assignment=_plan(0), objective_s=5.0, bound_s=2.98, message="gap")
    out = planner._with_late(ctx, close, _raw(objective=3.0))
    assert out.status == "OPTIMAL" and out.message == ""
    assert planner._with_late(ctx, searched, _raw(objective=6.0)) is searched
    assert planner._with_late(ctx, searched, None) is searched
    empty = RawResult("NO_SOLUTION", "cpsat", bound_s=2.5)
    out = planner._with_late(ctx, empty, _raw(objective=3.0))
    assert out.status == "FEASIBLE" and out.objective_s == 3.0


def test_a_failed_dp_is_left_out_and_the_search_stands():
    feed = late_hint.Beside(_failing)
    heur: dict = {}
    assert planner._collect(feed, heur, Deadline(None), Deadline(None)) is None and heur == {}


def test_a_result_already_back_is_taken_whatever_the_time_left():
    feed = late_hint.Beside(_raw)
    _wait_back_pipe(feed)
    got = feed.result(0.0, stop=lambda: True)
    assert isinstance(got, RawResult) and got.objective_s == 3.0
    feed = late_hint.Beside(_raw)
    _wait_back_pipe(feed)
    heur: dict = {}
    spent = Deadline(0.0)  # (the DP's own deadline long past)
    assert planner._collect(feed, heur, Deadline(60.0), spent).objective_s == 3.0 and "dp" in heur


def test_ctrl_c_takes_the_dps_best_so_far():
    """Ctrl-C here interrupts the DP's own deadline in its process (SIGUSR1), which returns its best so far."""
    import threading

    mine = Deadline(60.0)
    feed = late_hint.Beside(lambda: _until_interrupted(mine), interrupt=mine.interrupt)
    dl = Deadline(60.0)
    timer = threading.Timer(0.3, dl.interrupt)
    timer.start()
    heur: dict = {}
    t0 = time.monotonic()
    got = planner._collect(feed, heur, dl, Deadline(60.0))
    timer.cancel()
    assert got is not None and got.objective_s == 7.0 and heur["dp"] is got
    assert 0.25 < time.monotonic() - t0 < 3.0
    assert _gone(feed._worker.pid)


def test_ctrl_c_does_not_wait_for_a_dp_that_ignores_it():
    """A DP that does not stop when interrupted is killed STOP_WAIT_S later: the command does not wait for it."""
    import threading

    feed = late_hint.Beside(_slow_raw)
    dl = Deadline(60.0)
    timer = threading.Timer(0.3, dl.interrupt)
    timer.start()
    t0 = time.monotonic()
    assert planner._collect(feed, {}, dl, Deadline(60.0)) is None
    timer.cancel()
    assert 0.25 < time.monotonic() - t0 < 0.3 + late_hint.STOP_WAIT_S + 2.0
    assert _gone(feed._worker.pid)
