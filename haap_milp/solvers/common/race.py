"""Two exact engines racing on one node, one on the calling thread and one on a helper thread (eq. N21,
formulations/README.md): the first to finish the node stops the other.

Why: on the nodes that hold the bench's open rows, CP-SAT and HiGHS' branch and bound each finish some nodes
many times faster than the other, and which one is not known before (measured on 16 node models of four rows:
HiGHS proved in 0.46 s a node CP-SAT needed 6 s for, CP-SAT in 0.6 s a node HiGHS needed 3.2 s for).
Both release the GIL while they search, so on two cores the race costs the faster engine little.

This module knows no solver: a racer is a function of the race's own ``Deadline`` (no time limit, its own interrupt
flag), with whose ``stopper`` it registers its stop; the race's end is that deadline's ``interrupt``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from haap_milp.deadline import Deadline

R = TypeVar("R")
POLL_S = 0.01  # s between stop calls while a stopped racer winds down (a stop before its search starts is lost)
_pool: list[ThreadPoolExecutor] = []
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child (``worker.py``): the helper thread did not survive the fork; a race there makes a new one."""
    global _pool_lock
    _pool.clear()
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _helper() -> ThreadPoolExecutor:
    """One long-lived helper thread per process: HiGHS keeps its task scheduler per thread (HighsTaskExecutor's
    thread-local handle), made on the thread's first run, so a fresh thread per race would make one each time."""
    with _pool_lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="haap-race"))
        return _pool[0]


def race(here: Callable[[Deadline], R], there: Callable[[Deadline], R], done: Callable[[R], bool],
         failed: Callable[[BaseException], R]) -> tuple[R, R]:
    """Run ``there`` on the helper thread and ``here`` on this one; when either returns a result ``done`` accepts,
    the other is stopped, again every POLL_S until it returns (a stop sent before its search started is lost).
    Returns both results (``failed(exc)`` for a racer that raised). Never leaves a racer running: this thread
    waits for ``there``, and stops it unless ``here`` returned unfinished (``there`` then keeps its own time)."""
    r = Deadline(None)  # the race: its interrupt is the end, calling every stop registered with it
    here_back = threading.Event()

    def run(fn: Callable[[Deadline], R]) -> R:
        try:
            return fn(r)
        except Exception as exc:  # noqa: BLE001 - a failed racer is a result; the other may still finish
            return failed(exc)

    def helper() -> R:
        out = run(there)
        if done(out):
            while not here_back.is_set():
                r.interrupt()
                here_back.wait(POLL_S)
        return out

    fut: Future = _helper().submit(helper)
    mine = None
    try:
        mine = run(here)
    finally:
        here_back.set()
        stop = mine is None or done(mine)  # interrupted, or ``here`` finished the node; else ``there`` keeps its time
        while not fut.done():
            if stop:
                r.interrupt()
            with contextlib.suppress(Exception):
                fut.result(timeout=POLL_S)
    return mine, fut.result()
