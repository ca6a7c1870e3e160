"""Eq. PAR5: ``worker.fork_map`` (serial work split between this process and one forked child) and its users, the
presolve's mixed-stage enumeration and pricing and the DP heuristic's polish (eq. LS2), which give the same problem
and the same plan on two processes as on one."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from forked import gone, needs_fork, refuse_fork

from haap_milp import mixed_stages, presolve, worker
from haap_milp.catalog import load_cluster, load_model
from haap_milp.deadline import Deadline, use
from haap_milp.estimator import Estimator
from haap_milp.solvers import dp
from haap_milp.specs import SolveOptions, TrainingSpec

pytestmark = needs_fork


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(worker, "cpus", lambda: 2)  # (the split also on a one-CPU machine)


def _dies_in_child(parent: int):
    """x + 1 here; in any other process (the forked child) the process ends at once."""

    def dies(x):
        if os.getpid() != parent:
            os._exit(3)
        return x + 1

    return dies


def _square_pid(x):
    return x * x, os.getpid()


def test_results_in_order_the_odd_items_on_one_child(two_cpus):
    for n in (2, 5, 8):
        got = worker.fork_map(_square_pid, list(range(n)), threads=2)
        assert [v for v, _ in got] == [i * i for i in range(n)]
        pids = {i % 2: set() for i in range(n)}
        for i, (_v, pid) in enumerate(got):
            pids[i % 2].add(pid)
        assert pids[0] == {os.getpid()}
        assert len(pids[1]) == 1 and os.getpid() not in pids[1]  # one child, not this process
        assert gone(pids[1].pop())  # reaped


def test_serial_where_it_should_be(two_cpus, monkeypatch):
    here = {os.getpid()}
    assert {p for _, p in worker.fork_map(_square_pid, [1, 2, 3], threads=1)} == here
    assert {p for _, p in worker.fork_map(_square_pid, [1], threads=2)} == here
    assert worker.fork_map(_square_pid, [], threads=2) == []
    monkeypatch.setattr(worker, "cpus", lambda: 1)
    assert {p for _, p in worker.fork_map(_square_pid, [1, 2, 3], threads=2)} == here


def _nested(_request):
    """In a forked child: fork_map there runs every item in that child (no third process)."""
    return {p for _, p in worker.fork_map(_square_pid, [1, 2, 3, 4], threads=2)}, os.getpid()


def test_no_fork_inside_a_forked_child(two_cpus):
    w = worker.Worker(_nested)
    w.submit(0)
    back, (pids, child) = w.reply(20.0)
    w.close()
    assert back and pids == {child}


def _fails_on_three(x):
    if x == 3:
        raise ValueError(f"item {x}")
    return x


def test_a_fork_that_fails_runs_the_loop_here(two_cpus, monkeypatch):
    monkeypatch.setattr(worker.os, "fork", refuse_fork)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert {p for _, p in worker.fork_map(_square_pid, [1, 2, 3], threads=2, interrupt=lambda: None)} == {
        os.getpid()}
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before  # (SIGUSR1 not left blocked)


def test_a_failing_item_raises_here_as_it_would_serially(two_cpus):
    with pytest.raises(ValueError, match="item 3"):  # (item 3 is the child's: rerun here, raised here)
        worker.fork_map(_fails_on_three, [0, 1, 2, 3], threads=2)


def test_a_child_that_dies_or_hangs_has_its_items_run_here(two_cpus, monkeypatch):
    parent = os.getpid()
    dies = _dies_in_child(parent)
    assert worker.fork_map(dies, [0, 1, 2, 3], threads=2) == [1, 2, 3, 4]

    def hangs(x):
        if os.getpid() != parent:
            time.sleep(60)
        return x + 1

    monkeypatch.setattr(worker, "CHILD_SLACK_S", 0.3)
    t0 = time.monotonic()
    assert worker.fork_map(hangs, [0, 1, 2, 3], threads=2) == [1, 2, 3, 4]
    assert time.monotonic() - t0 < 5.0  # not the child's 60 s: stopped after 2 x this process's share + 0.3 s


def test_without_rerun_what_the_child_does_not_bring_back_is_none(two_cpus):
    dies = _dies_in_child(os.getpid())
    assert worker.fork_map(dies, [0, 1, 2], threads=2, rerun=False) == [1, None, 3]


def test_stop_nudges_the_child_which_returns_its_best_so_far(two_cpus):
    dl = Deadline(None)
    parent = os.getpid()

    def walk(x):  # the child's item runs until its copy of the deadline is interrupted (by the nudge)
        if os.getpid() != parent:
            while not dl.interrupted:
                time.sleep(0.01)
            return "stopped"
        dl.interrupt()  # (Ctrl-C reaches this process while its own item runs)
        return "here"

    t0 = time.monotonic()
    assert worker.fork_map(walk, [0, 1], threads=2, stop=lambda: dl.interrupted, interrupt=dl.interrupt) == \
        ["here", "stopped"]
    assert time.monotonic() - t0 < worker.STOP_WAIT_S + 1.0


CLUSTER = "h100-80g:16@ib,h100-80g:16@roce,a100-80g:16@ib,a100-80g:16@roce,a100-40g:16@ib,a100-40g:16@roce"


def _presolved(threads: int):
    model = load_model("llama3-8b")
    cluster = load_cluster(CLUSTER)
    training = TrainingSpec(global_batch_size=256, seq_len=2048)
    opts = SolveOptions(time_limit_s=30, threads=threads, mixed_stages="on")
    pre = presolve.build(model, cluster, training, opts, Estimator(model, cluster, training))
    return pre, opts


@pytest.fixture(scope="module")
def presolved_one():
    """``_presolved(1)``, built once for the module's tests (each reads it; none writes into it)."""
    return _presolved(1)


@pytest.fixture(scope="module")
def dp_one(presolved_one):
    """The DP heuristic on ``presolved_one`` in one process, from an empty ``root_setup`` memo (as on a fresh problem):
    (its result, the memo it left). With one thread nothing forks, so eq. PAR5e's switch plays no part in it."""
    from haap_milp.solvers.common import bounds

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bounds, "_ROOTS", {})
        with use(Deadline(None)):
            one = dp.solve(presolved_one[0].problem, SolveOptions(time_limit_s=30, threads=1))
        return one, bounds._ROOTS


def _memo_after(dp_one) -> dict:
    """A copy of the ``root_setup`` memo ``dp_one``'s run left (its entries copied: a test's runs fill in their own)."""
    return {k: list(e) for k, e in dp_one[1].items()}


def test_presolve_the_same_problem_on_two_processes(two_cpus, presolved_one):
    one, _ = presolved_one
    two, _ = _presolved(2)
    p, q = one.problem, two.problem
    assert sum(1 for o in p.options if o.mix) > 0  # (the instance has mixed options to enumerate, on both islands)
    groups = presolve.cluster_groups(load_cluster(CLUSTER))
    assert len(mixed_stages.pair_batches(groups, mixed_stages.island_pairs(groups))) == 2  # one share per island
    assert p.options == q.options and p.max_stages == q.max_stages and len(p.variants) == len(q.variants)
    for u, v in zip(p.variants, q.variants):
        for f in dataclasses.fields(u):
            a, b = getattr(u, f.name), getattr(v, f.name)
            if isinstance(a, np.ndarray):
                assert a.shape == b.shape and a.tobytes() == b.tobytes(), f.name
            else:
                assert a == b, f.name
    assert one.lower_bounds_s == two.lower_bounds_s


@pytest.mark.parametrize("share", [True, False])
def test_dp_heuristic_the_same_plan_on_two_processes(two_cpus, monkeypatch, presolved_one, dp_one, share):
    """``share``: eq. PAR5e, the look-ahead's variants taken from one shared list (else eq. PAR5b's fixed halves). The
    one-process run is ``dp_one``'s (the same for both); the two-process run follows it, from the memo it left."""
    from haap_milp.solvers.common import bounds

    monkeypatch.setattr(dp, "SHARE_LOOK_AHEAD", share)
    monkeypatch.setattr(bounds, "_ROOTS", _memo_after(dp_one))
    pre, _ = presolved_one
    one, _ = dp_one
    calls = []
    real = worker.fork_map
    monkeypatch.setattr(dp, "fork_map", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    with use(Deadline(None)):
        two = dp.solve(pre.problem, SolveOptions(time_limit_s=30, threads=2))
    assert calls and max(calls) == 2  # the look-ahead's and LS2's shares went to two processes
    assert one.assignment == two.assignment and one.objective_s == two.objective_s
    assert one.stats["splits"] == two.stats["splits"]  # the same runs, in the same order
    assert one.stats["runs_ahead"] == 0 and two.stats["runs_ahead"] > 0  # (the loop took the look-ahead's runs)


def test_dp_look_ahead_runs_are_the_loops(two_cpus, monkeypatch):
    """The loop takes a look-ahead's run only where it is the run the loop would make: with the look-ahead's second
    passes (eq. DP8b) at other charges (its share changed while the look-ahead runs), the loop makes those itself
    and ends with the same plan and the same runs as one process (caught when the runs are keyed without their
    charge)."""
    model, cluster = load_model("gpt3-1.3b"), load_cluster("h100-80g:16@ib,a100-80g:16@roce")
    training = TrainingSpec(global_batch_size=256, seq_len=2048)
    problem = presolve.build(model, cluster, training, SolveOptions(threads=1),
                             Estimator(model, cluster, training)).problem
    with use(Deadline(None)):
        want = dp.solve(problem, SolveOptions(time_limit_s=30, threads=1))
        ahead = dp.solve(problem, SolveOptions(time_limit_s=30, threads=2))
    assert ahead.assignment == want.assignment and ahead.stats["splits"] == want.stats["splits"]
    real = dp._look_ahead

    def other_charges(*args):
        monkeypatch.setattr(dp, "CROSS_SHARE", 0.25)
        try:
            return real(*args)
        finally:
            monkeypatch.setattr(dp, "CROSS_SHARE", 0.5)

    monkeypatch.setattr(dp, "_look_ahead", other_charges)
    with use(Deadline(None)):
        got = dp.solve(problem, SolveOptions(time_limit_s=30, threads=2))
    assert got.assignment == want.assignment and got.stats["splits"] == want.stats["splits"]
    assert 0 < got.stats["runs_ahead"] < ahead.stats["runs_ahead"]  # (first passes taken, second ones made again)


def test_variant_tables_and_bounds_the_same_on_two_processes(two_cpus, monkeypatch, presolved_one):
    """The exact search's set-up (``branch_and_bound._variant_tables``): the child's eq. B2 bounds are the loop's, the
    tables are built here for every variant, in order; with the clock already past and a warm start in hand it gives
    none on two processes as on one. (SETUP_FORK_S 0: it forks whatever the set-up's size.) Each call starts from an
    empty ``root_setup`` memo but the last: with every variant memoised it computes none again (the very objects)."""
    from haap_milp.solvers.common import bounds
    from haap_milp.solvers.common import branch_and_bound as bb

    def fresh():
        monkeypatch.setattr(bounds, "_ROOTS", {})

    monkeypatch.setattr(bb, "SETUP_FORK_S", 0.0)
    forked = []
    monkeypatch.setattr(bb, "fork_map", lambda fn, items, threads, **kw: forked.append(threads) or
                        worker.fork_map(fn, items, threads, **kw))

    pre, _ = presolved_one
    problem = pre.problem
    assert len(problem.variants) >= 3
    fresh()
    t1, b1 = bb._variant_tables(problem, False, float("inf"), 1)
    fresh()
    t2, b2 = bb._variant_tables(problem, False, float("inf"), 2)
    assert forked == [1, 2] and b1 == b2 and [t.v for t in t2] == list(range(len(problem.variants)))
    for x, y in zip(t1, t2):
        for f in dataclasses.fields(x):
            a, b = getattr(x, f.name), getattr(y, f.name)
            if isinstance(a, np.ndarray):
                assert a.tobytes() == b.tobytes(), f.name
    fresh()
    assert bb._variant_tables(problem, True, 0.0, 2) == (None, None)
    fresh()
    assert bb._variant_tables(problem, False, 0.0, 2)[0] is not None  # (no plan in hand: the tables are built)
    fresh()
    monkeypatch.setattr(bb, "SETUP_FORK_S", 1e9)  # (a set-up this small stays in this process)
    forked.clear()
    t3, b3 = bb._variant_tables(problem, False, float("inf"), 2)
    assert forked == [1] and b3 == b1
    forked.clear()
    t4, b4 = bb._variant_tables(problem, False, float("inf"), 2)  # (all memoised: nothing to compute or fork)
    assert all(x is y for x, y in zip(t3, t4)) and b4 == b3 and all(n == 1 for n in forked)


def test_dp_heuristic_variant_set_up_is_the_exact_search_s(monkeypatch, presolved_one, dp_one):
    """``bounds.root_setup``: the DP heuristic's variant loop memoises each variant's root tables and eq. B2 bound,
    and the exact search's set-up takes them (the very objects) instead of building them again; after the DP has run
    they are still what a fresh build gives (no caller wrote into the shared tables). The DP's run is ``dp_one``'s
    (from an empty memo, as this test's own run was); the memo here is a copy of the one it left."""
    from haap_milp.solvers.common import bounds
    from haap_milp.solvers.common import branch_and_bound as bb
    from haap_milp.solvers.common.slot_bounds import build_tables

    pre, _ = presolved_one
    monkeypatch.setattr(bounds, "_ROOTS", _memo_after(dp_one))
    problem = pre.problem
    known = [v for v in range(len(problem.variants)) if bounds.root_known(problem, v)]
    assert len(known) >= 3, known
    memo = {v: bounds.root_setup(problem, v) for v in known}
    tables, vb = bb._variant_tables(problem, False, float("inf"), 1)
    for v in known:
        assert tables[v] is memo[v][0] and vb[v] == memo[v][1]
        fresh = build_tables(problem, v)
        for f in dataclasses.fields(fresh):
            a, b = getattr(fresh, f.name), getattr(tables[v], f.name)
            if isinstance(a, np.ndarray):
                assert a.tobytes() == b.tobytes(), (v, f.name)
            elif not isinstance(a, dict):
                assert a == b, (v, f.name)
        assert bounds.variant_bound(problem, fresh) == vb[v]


@pytest.mark.parametrize("slow", ["here", "there"])
def test_taken_shares_a_list_between_two_processes(two_cpus, slow):
    """Eq. PAR5e: two processes that take a list's items from one shared queue (made before the fork) take each item
    once between them, every item, in the list's order each; the one whose items are slow takes fewer (the other takes
    what it would have waited on). Caught when the queue is not shared (each process takes the whole list) or
    ``taken`` skips or repeats an item."""
    items = list(range(12))
    parent = os.getpid()
    queue = worker.shared_queue()

    def take(_share):
        got = []
        for x in worker.taken(items, queue):
            got.append(x)
            if (os.getpid() == parent) == (slow == "here"):
                time.sleep(0.2)  # (long beside a fork's start, even on a loaded machine)
        return got

    here, there = worker.fork_map(take, [0, 1], 2)
    assert sorted(here + there) == items and here == sorted(here) and there == sorted(there)
    assert len(here) < len(there) if slow == "here" else len(there) < len(here)
    assert list(worker.taken(items, None)) == items  # (no queue: the whole list, as one process walks it)
