"""Eq. PAR2: the branch and bound's nodes run by forked worker processes (``worker.py``,
``solvers/common/node_pool.py``).

The worker itself: a round trip, a failure and a death come back as replies, ``close`` kills a busy one and reaps it.
The search: with the workers started at the first node, CP-SAT and the MILP still find brute force's optimum on random
problems (and the workers ran nodes); a worker whose nodes fail hands them back and the search ends right in one
process; Ctrl-C (the deadline's interrupt) ends a long pooled search at once and leaves no child process."""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys
import threading
import time
import types
from multiprocessing.connection import wait
from multiprocessing.sharedctypes import RawValue

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from forked import EXACT, needs_fork, refuse_fork
from forked import gone as _gone
from synthetic import assert_exact_solvers_match_brute, large_problem, random_problem

from haap_milp import worker
from haap_milp.deadline import Deadline, use
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.solvers.common import node_pool
from haap_milp.specs import SolveOptions

pytestmark = needs_fork


def _double(x):
    return 2 * x


def _fail(_x):
    raise ValueError("no")


def _die(_x):
    os._exit(3)


def _sleep(_x):
    time.sleep(30)


def test_worker_round_trip_failure_and_death():
    w = worker.Worker(_double)
    assert w.reply(0.0) == (False, None)  # nothing asked yet
    w.submit(21)
    assert w.reply(10.0) == (True, 42)
    w.submit(5)
    assert w.reply(10.0) == (True, 10)
    w.close()
    assert _gone(w.pid)
    w = worker.Worker(_fail)
    w.submit(1)
    back, reply = w.reply(10.0)
    assert back and isinstance(reply, ValueError)
    w.close()
    w = worker.Worker(_die)
    w.submit(1)
    back, reply = w.reply(10.0)
    assert back and isinstance(reply, RuntimeError) and "ended" in str(reply)
    w.close()
    assert _gone(w.pid)


_KEPT = worker.carry(threading.local())
_LEFT = threading.local()


def _seen(_request):
    return getattr(_KEPT, "memo", None), getattr(_LEFT, "memo", None)


def test_a_workers_serving_thread_starts_with_the_carried_memos():
    """A memo registered with ``worker.carry`` holds in the child's serving thread what it held in the thread that
    forked (the slot tables' memory part, built once by the search, is not rebuilt in every node worker); per-thread
    state not registered stays behind (HiGHS' executor); the child's changes do not come back."""
    _KEPT.memo, _LEFT.memo = {"tables": 1}, {"executor": 2}
    try:
        w = worker.Worker(_seen)
        w.submit(0)
        assert w.reply(10.0) == (True, ({"tables": 1}, None))
        w.close()
    finally:
        del _KEPT.memo, _LEFT.memo
    assert not hasattr(_KEPT, "memo")


def test_close_kills_a_busy_worker():
    w = worker.Worker(_sleep)
    w.submit(1)
    assert w.reply(0.2) == (False, None)
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < 5.0
    assert _gone(w.pid)


def _split_problem(seed: int = 1, num_gpus: int = 256):
    """A problem too large for brute force (3 GPU types, 8 layers over up to 4 stages, 111-141 options a variant) whose
    nodes split whatever the engines' speed: with eq. N17c's probe time scaled by 1/4 to 8 the workers sent back 10-28
    children on seed 1 x 256 GPUs and 10-18 on seed 3 x 128 GPUs, split on their tau range and on their stage count
    (measured); each solve takes 0.2-1.4 CPU s. (The MILP's problem before, 64 GPUs x 2 types of seed 2, split only
    where a probe ran out of time: with 8 times the probe time none of its nodes split. Its solves took 10-22 CPU s,
    those of CP-SAT's, seed 1, about 30.)"""
    return large_problem(seed, num_gpus=num_gpus, num_types=3, num_layers=8, max_stages=4, micro_batches=(8, 16))


def test_no_workers_with_one_thread_or_one_cpu(monkeypatch):
    """--threads 1, or one CPU to run on: the search stays in one process (with two of each the same search starts
    its workers: the problem has the open nodes to hand out)."""
    _pooled(monkeypatch)
    problem = _split_problem()
    res = get_solver("cpsat")(problem, SolveOptions(time_limit_s=30, relative_gap=0.0, threads=1, seed=0))
    assert res.status == "OPTIMAL" and "node_workers" not in res.stats
    res = get_solver("cpsat")(problem, EXACT)
    assert res.status == "OPTIMAL" and res.stats.get("node_workers") == 2
    monkeypatch.setattr(node_pool, "cpus", lambda: 1)
    res = get_solver("cpsat")(problem, EXACT)
    assert res.status == "OPTIMAL" and "node_workers" not in res.stats


def test_close_kills_a_child_that_does_not_leave():
    """A child asked to leave while it is still inside a request (its reply lost) is killed after CLOSE_WAIT_S:
    ``close`` never hangs."""
    w = worker.Worker(_sleep)
    w.submit(1)
    w.busy = False  # (as if its reply had been taken: ``close`` asks it to leave instead of killing it)
    t0 = time.monotonic()
    w.close()
    assert worker.CLOSE_WAIT_S <= time.monotonic() - t0 < worker.CLOSE_WAIT_S + 3.0
    assert _gone(w.pid)


def _dead_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl's parent-death signal is Linux's")
def test_a_worker_dies_with_its_parent():
    """A parent killed outright (SIGKILL: no cleanup) takes its workers with it: none runs on as an orphan."""
    script = ("import sys, time\n"
              "from haap_milp import worker\n"
              "def nap(_):\n    time.sleep(60)\n"
              "w = worker.Worker(nap)\nw.submit(1)\nprint(w.pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert not _dead_or_zombie(pid)
    finally:
        parent.kill()
        parent.wait()
    end = time.monotonic() + 5.0
    while not _dead_or_zombie(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert _dead_or_zombie(pid)


def _pooled(monkeypatch):
    monkeypatch.setattr(bb, "POOL_AFTER_S", 0.0)  # the workers from the first node on
    monkeypatch.setattr(node_pool, "cpus", lambda: 2)  # (also on a one-CPU machine)


@pytest.mark.parametrize("seed", range(8))
def test_pooled_search_finds_brute_forces_optimum(monkeypatch, seed):
    _pooled(monkeypatch)
    problem = random_problem(300 + seed, num_layers=8, max_stages=4, max_options=6)
    assert_exact_solvers_match_brute(problem, EXACT)


def _count_children(monkeypatch) -> dict:
    """The workers' replies merged into the search (``_merge``, in this process) and the children they brought."""
    seen, merge = {"replies": 0, "children": 0}, bb._merge

    def counted(st, heap, node, reply):
        if not isinstance(reply, BaseException):
            seen["replies"] += 1
            seen["children"] += len(reply[0])
        return merge(st, heap, node, reply)

    monkeypatch.setattr(bb, "_merge", counted)
    return seen


@pytest.mark.parametrize(("seed", "num_gpus", "name"), [(1, 256, "cpsat"), (3, 128, "milp")])
def test_pooled_search_agrees_with_one_process(monkeypatch, seed, num_gpus, name):
    """On problems too large for brute force whose nodes split (children come back from the workers: 10 or more on
    each, measured; ``_split_problem``), the pooled search proves the optimum one process proves, and its bound stays
    below it. Caught when the workers' children are lost (on the first) or never made, or their better plans dropped."""
    problem = _split_problem(seed, num_gpus)
    # (a limit the proofs never reach, as headroom on a loaded machine: each run takes 0.2-1.4 CPU s here)
    exact = EXACT.model_copy(update={"time_limit_s": 150})
    monkeypatch.setattr(bb, "POOL_SIZE", 0)
    one = get_solver(name)(problem, exact)
    monkeypatch.setattr(bb, "POOL_SIZE", 2)
    _pooled(monkeypatch)
    seen = _count_children(monkeypatch)
    res = get_solver(name)(problem, exact)
    assert res.status == one.status == "OPTIMAL"
    assert res.stats.get("worker_nodes", 0) > 0 and seen["replies"] == res.stats["worker_nodes"]
    assert seen["children"] > 0, seen  # (the workers split nodes, not only closed them)
    tol = max(res.stats.get("tolerance_s", 0.0), one.stats.get("tolerance_s", 0.0)) + 1e-6 * one.objective_s
    assert res.objective_s == pytest.approx(one.objective_s, abs=tol)
    assert res.bound_s <= one.objective_s + tol


def test_merge_takes_a_workers_node_as_this_process_would():
    """What a worker's node added reaches this process's search: children pushed (renumbered), closed bounds, errors,
    the tolerance, a better plan (a worse one ignored); a failed node goes back open."""
    st = bb._State()
    st.inc, st.inc_obj = "old plan", 10.0
    heap: list = []
    node = (1.0, 0, 0.1, 0.2, 0, 0, 9, 5, None, bb.NO_KEEP, None)
    point = {("tau",): 0.1}  # (eq. N2d: the parent's LP point travels with a child)
    children = [(1.5, 0, 0.1, 0.15, 0, 0, 9, 5, None, bb.NO_KEEP, point),
                (1.6, 0, 0.15, 0.2, 0, 0, 9, 6, None, bb.NO_KEEP, None)]
    bb._merge(st, heap, node, (children, [2.0], "new plan", 9.0, ["e"], 1e-4, {}))
    assert sorted(c[0] for c in heap) == [1.5, 1.6] and len({c[7] for c in heap}) == 2
    assert [c[:7] + c[8:] for c in sorted(heap)] == [c[:7] + c[8:] for c in children]
    assert st.closed == [2.0] and st.errors == ["e"] and st.tol_s == 1e-4 and st.nodes == 1
    assert (st.inc, st.inc_obj) == ("new plan", 9.0)
    bb._merge(st, heap, node, ([], [], "worse plan", 9.5, [], 0.0, {}))
    assert (st.inc, st.inc_obj) == ("new plan", 9.0)
    bb._merge(st, heap, node, RuntimeError("worker failed"))
    assert node in heap and st.nodes == 2


def _publish_nine(shared):
    st = bb._State(shared=shared)
    st.inc, st.inc_obj = "plan", 9.0
    st.publish()
    st.inc_obj = 9.5  # (a worse plan published later never raises the shared time)
    st.publish()
    return shared.value


def test_a_workers_better_plan_sets_every_workers_cut_off():
    """Eq. PAR2c: a plan time one worker publishes is the cut-off of this process and of any worker at once (shared
    memory mapped before the fork), before the plan itself comes back; never raised by a worse one."""
    shared = RawValue("d", 10.0)
    st = bb._State(shared=shared)
    assert st.cut(0.01) is None  # (no plan held here: no cut-off)
    st.inc, st.inc_obj = "plan", 10.0
    w = worker.Worker(lambda _: _publish_nine(shared))
    w.submit(0)
    assert w.reply(10.0) == (True, 9.0)
    w.close()
    assert st.best_known() == 9.0 and st.cut(0.01) == pytest.approx(9.0 * 0.99)
    assert bb._State(inc="plan", inc_obj=10.0).cut(0.01) == pytest.approx(9.9)  # (no pool: its own plan's)


class _EngineRan(BaseException):  # (not an Exception: ``_call`` would take it for the engine's failure)
    pass


def _engine_ran(*_args, **_kw):
    raise _EngineRan


def test_the_engine_is_not_run_on_a_node_the_shared_cut_off_closes():
    """Eq. PAR2c: a node whose bound reaches the cut-off of a plan found elsewhere since it began is closed at that
    cut-off without the engine; below it, the engine runs."""
    options, lm = SolveOptions(relative_gap=0.01), types.SimpleNamespace(names=[])
    node = (8.95, 0, 0.1, 0.2, 0, 0, 9, 5, None, bb.NO_KEEP, None)
    plan = types.SimpleNamespace(variant=1)  # (another variant: no hint to check)
    st = bb._State(inc=plan, inc_obj=10.0, shared=RawValue("d", 9.0))
    done = bb._engine(None, options, st, [], lm, None, node, 9.9, time.perf_counter() + 5, "t", _engine_ran)
    assert done and st.closed == [pytest.approx(8.91)] and st.stats["shared_cuts"] == 1
    st = bb._State(inc=plan, inc_obj=10.0, shared=RawValue("d", 10.0))
    with pytest.raises(_EngineRan):
        bb._engine(None, options, st, [], lm, None, node, 9.9, time.perf_counter() + 5, "t", _engine_ran)


def test_the_workers_statistics_reach_the_result():
    """Eq. PAR2: what a worker's node added to its statistics (counts, running totals, times, maxima, engine runs) is
    summed into the search's result beside this process's own."""
    was = {"joint_dp": 3, "capacity_dp": 1, "max_vars": 50, "engine1": "v0 OPTIMAL 0.01s", "hint_objective_s": 9.0}
    now = {**was, "joint_dp": 5, "sigma_dp_s": 0.25, "max_vars": 80, "engine2": "v1 INFEASIBLE 0.02s"}
    added = bb.stats_added(was, now)
    assert added == {"joint_dp": 2, "sigma_dp_s": 0.25, "max_vars": 80, "engines": ["v1 INFEASIBLE 0.02s"]}
    into = {"joint_dp": 1, "max_vars": 90}
    bb.add_stats(into, added)
    bb.add_stats(into, {"joint_dp": 1, "max_vars": 70, "engines": ["v2 OPTIMAL 0.1s"]})
    assert into == {"joint_dp": 4, "sigma_dp_s": 0.25, "max_vars": 90,
                    "engines": ["v1 INFEASIBLE 0.02s", "v2 OPTIMAL 0.1s"]}


def test_a_pooled_search_reports_its_workers_engine_runs(monkeypatch):
    _pooled(monkeypatch)
    monkeypatch.setattr(bb, "POOL_SIZE", 2)
    res = get_solver("cpsat")(_split_problem(), EXACT)
    assert res.status == "OPTIMAL" and res.stats.get("worker_nodes", 0) > 0
    engines = [v for k, v in res.stats.items() if k.startswith("engine") and k[6:].isdigit()]
    assert any(v.endswith("(worker)") for v in engines) and "dp_bound_steps" in res.stats


def test_failed_worker_nodes_run_again_here(monkeypatch):
    """A worker whose node raises hands it back; the search then runs every node itself and still ends right."""
    _pooled(monkeypatch)
    parent, inner = os.getpid(), bb._node

    def node(*args, **kw):
        if os.getpid() != parent:
            raise RuntimeError("worker node failure (test)")
        return inner(*args, **kw)

    monkeypatch.setattr(bb, "_node", node)
    problem = random_problem(311, num_layers=8, max_stages=4, max_options=6)
    assert_exact_solvers_match_brute(problem, EXACT)
    res = get_solver("cpsat")(problem, EXACT)
    assert res.stats.get("worker_nodes", 0) == 0


def test_interrupt_ends_a_pooled_search_and_its_workers(monkeypatch):
    _pooled(monkeypatch)
    pids: list[int] = []
    start = node_pool.NodePool.start

    def recorded(self):
        start(self)
        pids.extend(w.pid for w in self.workers)

    monkeypatch.setattr(node_pool.NodePool, "start", recorded)
    problem = large_problem(3, num_gpus=1024, num_types=3, num_layers=80, max_stages=24)
    dl = Deadline(120.0)
    timer = threading.Timer(2.0, dl.interrupt)
    timer.start()
    t0 = time.monotonic()
    with use(dl):
        res = get_solver("cpsat")(problem, SolveOptions(time_limit_s=120, relative_gap=0.0, threads=2, seed=0))
    timer.cancel()
    assert time.monotonic() - t0 < 2.0 + 3.0  # (a node's model build is not interruptible: a little past it)
    assert res.status in ("FEASIBLE", "OPTIMAL", "NO_SOLUTION")
    assert len(pids) == 2
    for pid in pids:  # every worker ended and reaped (not a zombie: waitpid has nothing left to collect)
        assert _gone(pid)
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_probe_scale_makes_up_for_shared_cores():
    """Eq. PAR2b: two workers racing two engines each on two CPUs give each probe twice PROBE_S; with CPUs to spare,
    or one thread, none; never more than POOL_PROBE_SCALE."""
    assert bb.probe_scale(2, 2, 2) == 2.0
    assert bb.probe_scale(2, 2, 16) == 1.0
    assert bb.probe_scale(2, 1, 2) == 1.0
    assert bb.probe_scale(2, 8, 2) == bb.POOL_PROBE_SCALE


def test_no_fork_the_search_and_the_planner_run_here(monkeypatch):
    """The system refusing to fork (OSError: e.g. its process limit) leaves the search's nodes, the DP beside it (eq.
    PAR4) and eq. PAR5's shares in this process: the same optimum, no traceback."""
    _pooled(monkeypatch)
    problem = _split_problem()
    want = get_solver("cpsat")(problem, EXACT)
    assert want.status == "OPTIMAL" and want.stats.get("node_workers") == 2  # (forks allowed: the workers start)
    monkeypatch.setattr(worker.os, "fork", refuse_fork)
    res = get_solver("cpsat")(problem, EXACT)
    assert res.status == "OPTIMAL" and res.objective_s == pytest.approx(want.objective_s, rel=1e-9)
    assert res.stats.get("node_workers", 0) == 0
    from haap_milp import planner
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.specs import TrainingSpec

    out = planner.solve(load_model("gpt3-1.3b"), load_cluster("a100-80g:8@ib,a100-80g:8@roce"),
                        TrainingSpec(global_batch_size=32, seq_len=2048),
                        SolveOptions(time_limit_s=30, threads=2, relative_gap=1e-4, max_stages=6)).result
    assert out.status.value == "OPTIMAL" and "dp_beside" not in (out.stats or {})


class _Given(BaseException):  # (not an Exception: ``_call`` would take it for the engine's failure)
    pass


@pytest.mark.parametrize(("share_open", "heap_size", "elsewhere", "want"),
                         [(True, 0, 19, 1.0), (False, 0, 19, 10.0), (True, 0, 0, 10.0), (True, 19, 0, 1.0),
                          (True, 3, 39, 0.5)])
def test_a_worker_engine_run_shares_the_time_with_the_searchs_open_nodes(monkeypatch, share_open, heap_size,
                                                                          elsewhere, want):
    """Eq. PAR2d: a finishing engine run gets the time left over the open nodes + 1 (at least MIN_ENGINE_S doubled per
    retry, at least half of what is left over two); on a node worker its own heap is empty, so the count is the
    search's when it handed the node out (``_State.open_elsewhere``). Without it a worker's run had half the time
    left: 9.3 s on one mixtral-8x7b x hetero3-4096 node. ``want``: the share in units of 20 s / 20."""
    from haap_milp.specs import SolveOptions

    def engine(problem, lm, nb, cutoff, share, *_args, **_kw):
        raise _Given(share)

    monkeypatch.setattr(bb, "SHARE_OPEN", share_open)
    monkeypatch.setattr(bb, "MIN_ENGINE_S", 0.5)
    st = bb._State(inc=None, inc_obj=float("inf"), open_elsewhere=elsewhere)
    node = (8.0, 0, 0.1, 0.2, 0, 0, 9, 5, None, bb.NO_KEEP, None)
    with pytest.raises(_Given) as got:
        bb._engine(None, SolveOptions(), st, [()] * heap_size, types.SimpleNamespace(names=[]), None, node, None,
                   time.perf_counter() + 20.0, "t", engine)
    assert got.value.args[0] == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize(("restart", "tries", "want"), [(True, 0, 7), (True, 1, 8), (True, 3, 10), (False, 3, 7)])
def test_a_retried_node_runs_its_engines_from_another_seed(monkeypatch, restart, tries, want):
    """Eq. PAR2e: a node's first engine run uses the command's seed, its retries the seed + the tries (the same input
    still gives the same seeds); switched off, every run the command's."""

    def engine(problem, lm, nb, cutoff, share, hint, options, *_args, **_kw):
        raise _Given(options.seed)

    monkeypatch.setattr(bb, "RESTART_SEED", restart)
    st = bb._State(inc=None, inc_obj=float("inf"))
    node = (8.0, 0, 0.1, 0.2, tries, 0, 9, 5, None, bb.NO_KEEP, None)
    with pytest.raises(_Given) as got:
        bb._engine(None, SolveOptions(seed=7), st, [], types.SimpleNamespace(names=[]), None, node, None,
                   time.perf_counter() + 20.0, "t", engine)
    assert got.value.args[0] == want


def test_a_search_whose_last_reply_is_back_before_it_looks_ends_at_once(monkeypatch):
    """The last node a worker runs may be back before the search looks again (a loaded machine: this process is
    descheduled after the hand-out). The search then has no open node and no busy worker: it ends there, and does not
    wait out the time limit for a reply that already came (measured before: the tiny problem below took the whole
    limit, spinning)."""
    _pooled(monkeypatch)
    submit = node_pool.NodePool.submit

    def submit_and_let_it_finish(self, i, node, request):  # (the node done before this process goes on)
        submit(self, i, node, request)
        wait([self.workers[i].conn], timeout=10.0)

    monkeypatch.setattr(node_pool.NodePool, "submit", submit_and_let_it_finish)
    problem = random_problem(308, num_layers=8, max_stages=4, max_options=6)  # (its last reply has no children)
    limit = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=2, seed=0)
    t0 = time.perf_counter()
    res = get_solver("cpsat")(problem, limit)
    assert res.status == "OPTIMAL" and res.stats.get("worker_nodes", 0) > 0
    assert time.perf_counter() - t0 < 10.0


def test_waiting_on_no_busy_worker_returns_at_once():
    """``_wait`` with nothing handed out returns False at once (no reply can come), stops no worker, and does not spin
    to the deadline."""
    pool = node_pool.NodePool(lambda request: request, 2)
    t0 = time.perf_counter()
    assert bb._wait(pool, bb._State(), [], time.perf_counter() + 30.0) is False
    assert time.perf_counter() - t0 < 1.0 and not pool.dead


def test_workers_count_the_whole_searchs_unfinished_probes(monkeypatch):
    """Eq. N17f: a worker stops probing once the search's unfinished probes (every worker's, as the search merged them
    when it handed the node out) reach PROBE_FAILS, so a solve ends with at most PROBE_FAILS + workers - 1 of them (the
    others' probes still running when the count was reached); with each worker counting only its own it ran up to
    twice PROBE_FAILS. Every probe ends unfinished (as CP-SAT's on a large node); the optimum stays brute force's.
    (Seeds 0-11: 9 optima proven by brute force, each solve reaching PROBE_FAILS; with each worker counting its own, 7
    of them ran past PROBE_FAILS + 1. Seeds 12-15, left out, added one such case and half the time: seed 15's 184
    worker nodes.)"""
    from synthetic import all_models_large, solve_against_brute
    from test_engine_probe import _probes_time_out

    _pooled(monkeypatch)
    monkeypatch.setattr(bb, "ENGINE_WIDTH", 1e12)
    monkeypatch.setattr(bb, "PROBE_FAILS", 3)
    monkeypatch.setattr(bb, "PROBE_SPENT", 0.0)
    all_models_large(monkeypatch)
    _probes_time_out(monkeypatch)
    pooled = EXACT.model_copy(update={"threads": 2})
    most = total = checked = 0
    for seed in range(12):
        problem = random_problem(seed, num_groups=1 + seed % 2, num_layers=6 + seed % 3, max_stages=4, max_options=6)
        res = solve_against_brute(problem, "cpsat", pooled, seed)
        if res is None:
            continue
        fails = res.stats.get("probe_fails", 0)
        assert fails <= bb.PROBE_FAILS + 1, (seed, res.stats)
        most, total, checked = max(most, fails), total + fails, checked + 1
    assert checked >= 8 and most >= bb.PROBE_FAILS, (checked, most, total)  # (the probes did run out)


def test_joint_trial_stays_on_while_the_search_closes_nodes_with_it(monkeypatch):
    """Eq. N20d: a process whose own JOINT_TRIAL nodes eq. N20 did not close keeps it while another process of the
    search has closed one (``joint_elsewhere``, from the request); with no close anywhere it stops as before."""
    calls = []
    monkeypatch.setattr(bb, "joint_units", lambda dp, types, big: calls.append(1))  # (None: nothing more runs)
    problem = types.SimpleNamespace(groups=("h100-80g@a", "a100-80g@a"))
    far = time.perf_counter() + 60.0
    for elsewhere, runs in ((0, False), (1, True)):
        st = bb._State(joint_calls=bb.JOINT_TRIAL, joint_wins=0, joint_elsewhere=elsewhere)
        calls.clear()
        assert bb._joint(problem, st, None, 0.0, 1.0, None, 2.0, None, far, "t") == (1.0, None)
        assert bool(calls) is runs
    st = bb._State(joint_calls=bb.JOINT_TRIAL - 1)
    bb._joint(problem, st, None, 0.0, 1.0, None, 2.0, None, far, "t")
    assert calls  # (its own trial not over yet)


def test_the_joint_dp_counts_the_stage_counts_it_drops(monkeypatch):
    """Eq. N20f: a node where eq. N20 lifts a stage count the other bounds left under the cut-off to it (eq. N16 then
    drops that count) counts as a drop; a count already at the cut-off, or a lift that stays under it, does not. Only
    a close counts as a win (eq. N20d shares those)."""
    monkeypatch.setattr(bb, "USE_CROSSINGS", False)
    monkeypatch.setattr(bb, "USE_OWN_DIGITS", False)
    monkeypatch.setattr(bb, "USE_DP_TAU_CAP", False)
    monkeypatch.setattr(bb, "joint_units", lambda dp, types_, big: types.SimpleNamespace(R=np.array([1]), big=False))
    per_stage_count = {}

    def fake(*a):  # (the last argument: eq. N20h's record, no case run here)
        a[-1].update(plain=float(per_stage_count["jp"].min()), case_runs=0, case_s=0.0)
        return float(per_stage_count["jp"].min()), per_stage_count["jp"]

    monkeypatch.setattr(bb.joint_capacity, "joint_bound", fake)
    problem = types.SimpleNamespace(groups=("h100-80g@a", "a100-80g@a"), p2p_blocking=False)
    far, cutoff = time.perf_counter() + 60.0, 2.0
    others = np.array([1.0, 1.5, 3.0])  # the other bounds per stage count: the third already at the cut-off
    for jp, drops, closes in (([1.5, 2.5, 3.0], 1, 0), ([1.5, 1.9, 9.0], 0, 0), ([1.5, 2.0, 3.0], 1, 0),
                              ([2.5, 2.5, 3.0], 1, 1)):
        per_stage_count["jp"] = np.array(jp)
        st = bb._State()
        bound, per_p = bb._joint(problem, st, None, 0.0, 1.0, None, cutoff, others.copy(), far, "t")
        assert bound == pytest.approx(min(jp)) and per_p == pytest.approx(np.maximum(others, jp))  # (_safe: a hair under)
        assert (st.joint_calls, st.joint_drops, st.joint_wins) == (1, drops, closes), jp
        assert st.joint_s > 0


@pytest.mark.parametrize("drop_wins", [True, False])
def test_the_joint_dp_goes_on_after_its_trial_where_it_drops_counts_and_the_engine_costs_more(monkeypatch, drop_wins):
    """Eq. N20f's gate: after JOINT_TRIAL runs without a close, eq. N20 goes on only where it has dropped a stage count
    and an engine run has cost more than JOINT_DROP_RATIO times a run of it (on average); off with the switch."""
    monkeypatch.setattr(bb, "JOINT_DROP_WINS", drop_wins)
    ratio = bb.JOINT_DROP_RATIO
    trial = {"joint_calls": bb.JOINT_TRIAL, "joint_s": bb.JOINT_TRIAL * 0.01, "engine_calls": 2}
    for drops, engine_s, on in ((1, 2 * 0.011 * ratio, True), (1, 2 * 0.009 * ratio, False), (0, 2 * 0.1, False)):
        assert bb._joint_on(bb._State(joint_drops=drops, engine_s=engine_s, **trial)) is (on and drop_wins)
    assert not bb._joint_on(bb._State(joint_drops=1, joint_calls=bb.JOINT_TRIAL, joint_s=0.04))  # (no engine run yet)
    assert bb._joint_on(bb._State(joint_calls=bb.JOINT_TRIAL - 1))
    assert bb._joint_on(bb._State(joint_wins=1, **trial)) and bb._joint_on(bb._State(joint_elsewhere=1, **trial))
    st = bb._State()  # (the engine's time that the gate reads)
    bb._call(None, EXACT, st, None, None, None, 1.0, None, "t", lambda *a, **k: time.sleep(0.02) or
             bb.VariantResult("INFEASIBLE"), 0)
    assert st.engine_calls == 1 and st.engine_s >= 0.02


@pytest.mark.parametrize("gate", [True, False])
def test_sigma_cases_go_on_after_their_trial_only_where_their_closes_pay(monkeypatch, gate):
    """Eq. N20h's gate: sigma's cases run during their trial (CASE_TRIAL nodes), then only after a close of theirs,
    and once an engine has run, while their closes times an engine run's mean time reach CASE_RATIO times their own
    time; always with the switch off."""
    monkeypatch.setattr(bb, "USE_CASE_GATE", gate)
    ratio, trial = bb.CASE_RATIO, bb.CASE_TRIAL
    assert bb._cases_on(bb._State(case_calls=trial - 1, case_s=9.0, engine_calls=5, engine_s=0.01))
    assert bb._cases_on(bb._State(case_calls=trial, case_s=1.0)) is not gate  # (no close of theirs)
    assert bb._cases_on(bb._State(case_calls=trial, case_wins=1, case_s=1.0))  # (no engine run to price a close)
    for engine_s, on in ((1.01 * ratio, True), (0.99 * ratio, False)):  # two closes, two engine runs, 2 s of cases
        st = bb._State(case_calls=trial + 3, case_wins=2, case_s=2.0, engine_calls=2, engine_s=2 * engine_s)
        assert bb._cases_on(st) is (on or not gate), engine_s


def test_the_joint_dp_records_its_sigma_cases(monkeypatch):
    """Eq. N20h's record in ``_joint``: a node whose cases ran counts once, a close only where eq. N20 alone was below
    the cut-off and the cases reached it, and their time; the gate's answer reaches ``joint_bound``."""
    seen, types_ns = [], types.SimpleNamespace

    def fake(dp, a, mu, cutoff, beta, u, deadline, found, inc, cases, info):
        seen.append(cases)
        info.update(plain=1.0, case_runs=3 if cases else 0, case_s=0.25 if cases else 0.0)
        return (2.0 if cases else 1.0), np.array([np.inf, 2.0 if cases else 1.0])

    monkeypatch.setattr(bb.joint_capacity, "joint_bound", fake)
    monkeypatch.setattr(bb, "joint_units", lambda dp, types, big: types_ns(R=[1], big=False))
    monkeypatch.setattr(bb, "USE_DP_TAU_CAP", False)
    problem, dp = random_problem(1, num_layers=4, max_stages=2, max_options=3), types_ns(G=1)
    st = bb._State()
    for cutoff, wins in ((1.5, 1), (2.5, 1), (0.5, 1)):  # (closed by the cases; open; closed by eq. N20 alone)
        bb._joint(problem, st, dp, 0.0, -math.inf, None, cutoff, None, math.inf, "t")
        assert st.case_wins == wins, (cutoff, st)
    assert st.case_calls == 3 and st.case_s == pytest.approx(0.75) and seen == [True] * 3
    monkeypatch.setattr(bb, "_cases_on", lambda st: False)
    bb._joint(problem, st, dp, 0.0, -math.inf, None, 1.5, None, math.inf, "t")
    assert seen[-1] is False and st.case_calls == 3  # (no run of the cases: nothing recorded)


@pytest.mark.parametrize("switch", [True, False])
def test_the_big_state_runs_through_its_trial_and_then_only_where_it_has_closed_a_node(monkeypatch, switch):
    """Eq. N20k's gate and record: where every island holds one group, the big by-group state is allowed on the first
    BIG_TRIAL nodes of a process that need it, then only after one of them closed a node or lifted its bound by
    BIG_LIFT of the cut-off; ``_joint`` counts its runs, closes, time and lift; never with the switch off, nor on
    other clusters."""
    monkeypatch.setattr(bb, "USE_BIG", switch)
    trial, lift = bb.BIG_TRIAL, bb.BIG_LIFT
    assert bb._big_on(bb._State(island_groups=True, big_calls=trial - 1)) is switch
    assert not bb._big_on(bb._State(island_groups=False, big_calls=0))
    assert bb._big_on(bb._State(island_groups=True, big_calls=trial, big_lift=0.99 * lift)) is False
    assert bb._big_on(bb._State(island_groups=True, big_calls=trial, big_lift=lift)) is switch
    assert bb._big_on(bb._State(island_groups=True, big_calls=trial, big_wins=1)) is switch
    asked, types_ns = [], types.SimpleNamespace

    def fake(dp, a, mu, cutoff, beta, u, deadline, found, inc, cases, info):
        time.sleep(0.01)
        info.update(plain=2.0, case_runs=0, case_s=0.0)
        return 2.0, np.array([np.inf, 2.0])

    monkeypatch.setattr(bb.joint_capacity, "joint_bound", fake)
    monkeypatch.setattr(bb, "joint_units", lambda dp, types, big: asked.append(big) or types_ns(R=[1], big=big))
    monkeypatch.setattr(bb, "USE_DP_TAU_CAP", False)
    problem, dp = random_problem(1, num_layers=4, max_stages=2, max_options=3), types_ns(G=1)
    st = bb._State(island_groups=True)
    for cutoff, before in ((2.5, 1.5), (1.5, 1.0)):  # (open, lifted by 0.5 / 2.5; closed)
        bb._joint(problem, st, dp, 0.0, before, None, cutoff, None, math.inf, "t")
    assert asked == [switch] * 2
    assert (st.big_calls, st.big_wins) == ((2, 1) if switch else (0, 0)) and (st.big_s >= 0.02) is switch
    assert st.big_lift == pytest.approx(0.5 / 1.5 if switch else 0.0)  # (the closed node's lift: up to the cut-off)


@needs_fork
@pytest.mark.parametrize("share", [True, False])
def test_workers_learn_the_searchs_joint_closes(monkeypatch, tmp_path, share):
    """Eq. N20d's plumbing: each request carries the search's eq. N20 closes so far (this process's and the workers'
    merged from their replies), which the worker holds as ``joint_elsewhere`` while it runs the node; with the switch
    off, never. Every node here counts as one close (only eq. N20's gate reads the count, so the plans stay brute
    force's)."""
    _pooled(monkeypatch)
    monkeypatch.setattr(bb, "SHARE_JOINT_WINS", share)
    log = tmp_path / "seen"
    real = bb._node

    def counted(problem, options, st, *a, **kw):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {st.joint_elsewhere}\n")
        st.joint_wins += 1
        st.stats["joint_wins"] = st.joint_wins
        return real(problem, options, st, *a, **kw)

    monkeypatch.setattr(bb, "_node", counted)
    pooled = EXACT.model_copy(update={"threads": 2})
    for seed in range(4):
        problem = random_problem(300 + seed, num_layers=8, max_stages=4, max_options=6)
        assert_exact_solvers_match_brute(problem, pooled)
    seen = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    workers = [e for pid, e in seen if pid != os.getpid()]
    assert workers, seen  # (the workers ran nodes)
    assert any(e > 0 for e in workers) if share else not any(e > 0 for e in workers)
