"""A forked child process that serves requests while this one goes on (the exact search's node workers, eq. PAR2 in
formulations/README.md, ``node_pool.py``; the DP heuristic beside the search, eq. PAR4, ``late_hint.py``; HiGHS racing
CP-SAT on a node, eq. N21b, ``start``), and ``fork_map``, a loop's items shared with one such child (eq. PAR5). Every
fork haap makes is made here.

Why a process and not a thread: the search's node work is Python (numpy on small arrays) and holds the GIL, so a
thread would take its time from the search. Why fork: the child starts with the problem, its tables and the search's
state already in memory (a spawned process would import the package and rebuild them, 0.3-1.3 s).

The child ignores Ctrl-C (the parent stops it), serves the requests on a thread it makes after the fork (per-thread
state the forking thread carried over, such as HiGHS' task executor whose worker threads did not survive the fork, is
then never touched; the memos registered with ``carry`` are copied to it), sends back what ``serve`` returned or the
exception it raised, and leaves with ``os._exit`` (no atexit handlers, no second flush of the parent's buffers) when
the parent closes the pipe or sends ``None``; one that does not leave within CLOSE_WAIT_S of that is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from multiprocessing import Pipe, Value
from multiprocessing.connection import Connection

CLOSE_WAIT_S = 1.0  # s an idle child asked to leave gets before it is killed
CHILD_SLACK_S = 1.0  # s (fork_map) a child may take past twice the parent's own share
POLL_S = 0.05  # s between looks at ``stop`` while waiting for a child (fork_map)
STOP_WAIT_S = 0.5  # s a nudged child gets to send its best so far (fork_map)
_forked = False  # True in a forked child (Worker): fork_map runs serially there
_CARRIED: list[threading.local] = []  # per-thread memos a child's serving thread starts from (``carry``)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies


def available() -> bool:
    """True where a forked child can serve requests (POSIX)."""
    return hasattr(os, "fork")


def carry(local: threading.local) -> threading.local:
    """Registers a per-thread memo whose values a child's serving thread starts with (the forking thread's, copied
    after the fork); returns it. For pure caches of the problem only: HiGHS' executor and the like stay behind.
    Measured before (mixtral-8x22b x hetero3-1024): each node worker rebuilt the memory part of every variant it met
    (``slot_bounds``: 65 of 168 table builds, most of their 0.8 s of the workers' 19 s), which its parent held already."""
    _CARRIED.append(local)
    return local


def _carried() -> list[tuple[threading.local, dict]]:
    """The registered memos' values in this thread (the forking thread, in the child)."""
    return [(local, dict(local.__dict__)) for local in _CARRIED]


def _serve_with(carried: list, conn: Connection, serve: Callable[[object], object]) -> None:
    for local, values in carried:
        local.__dict__.update(values)
    _serve_all(conn, serve)


class Worker:
    """The child running ``serve(request) -> reply``: ``submit`` one request at a time, ``reply`` when it is back."""

    def __init__(self, serve: Callable[[object], object], on_nudge: Callable[[], object] | None = None) -> None:
        """``on_nudge``: what the child runs when the parent calls ``nudge`` (SIGUSR1; e.g. its deadline's
        ``interrupt``, so that a heuristic returns its best so far)."""
        mine, theirs = Pipe(duplex=True)
        for stream in (sys.stdout, sys.stderr):  # (the child must not flush the parent's buffered output again)
            with contextlib.suppress(Exception):
                stream.flush()
        nudges = on_nudge is not None and hasattr(signal, "SIGUSR1")
        # a nudge sent before the child has its handler would end it (SIGUSR1's default): blocked until then
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1}) if nudges else None
        try:
            with warnings.catch_warnings():  # (3.12+ warns on fork in a threaded process; the child uses no lock of
                warnings.simplefilter("ignore", DeprecationWarning)  # theirs)
                parent, pid = os.getpid(), os.fork()
        except OSError:  # (no child: this thread's mask and the pipe as they were, the error to the caller)
            if nudges:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            mine.close()
            theirs.close()
            raise
        if pid == 0:  # the child: never returns into the caller's code
            try:
                global _forked
                _forked = True
                _die_with(parent)
                mine.close()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                if nudges:
                    signal.signal(signal.SIGUSR1, lambda *_: on_nudge())
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                server = threading.Thread(target=_serve_with, args=(_carried(), theirs, serve), name="haap-worker")
                server.start()
                server.join()
            finally:
                os._exit(0)
        if nudges:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()
        self.pid, self._conn, self.busy, self._reaped = pid, mine, False, False
        self._nudges = nudges

    @property
    def conn(self) -> Connection | None:
        """The parent's end of the pipe (``multiprocessing.connection.wait`` on several workers)."""
        return self._conn

    def submit(self, request: object) -> None:
        self._conn.send(request)
        self.busy = True

    def nudge(self) -> None:
        """Run the child's ``on_nudge`` (a no-op for a child without one, or one that has ended)."""
        if self._conn is not None and self._nudges:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGUSR1)

    def reply(self, timeout_s: float = 0.0) -> tuple[bool, object]:
        """(True, the reply) once it is back within ``timeout_s``, else (False, None). A failed request, or a child
        that died, gives its exception as the reply (not raised)."""
        if not self.busy:
            return False, None
        try:
            if not self._conn.poll(max(timeout_s, 0.0)):
                return False, None
            value = self._conn.recv()
        except (EOFError, OSError) as exc:
            value = RuntimeError(f"the forked worker ended: {exc!r}")
        self.busy = False
        return True, value

    def close(self) -> None:
        """Stop the child (at once if a request is still running) and reap it (idempotent)."""
        self.stop()
        self.reap()

    def stop(self) -> None:
        """Ask the child to leave, or kill it if a request is still running (``reap`` waits for it; several children
        stopped first and reaped after tear down together)."""
        if self._conn is None:
            return
        with contextlib.suppress(Exception):
            if self.busy:
                os.kill(self.pid, signal.SIGKILL)
            else:
                self._conn.send(None)
        self._conn.close()
        self._conn = None

    def reap(self) -> None:
        """Wait for the stopped child to end; one that does not within CLOSE_WAIT_S is killed (never a hang)."""
        if self._reaped:
            return
        end = time.monotonic() + CLOSE_WAIT_S
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > end:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    break
                time.sleep(0.002)
        self._reaped = True

    def __del__(self) -> None:  # (a parent that forgot ``close``: no zombie, no open pipe)
        with contextlib.suppress(Exception):
            self.close()


def cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform tells it, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def start(fn: Callable[[], object], on_nudge: Callable[[], object] | None = None) -> Worker | None:
    """``fn()`` begun on a forked child (its ``reply``: what ``fn`` returned, or the exception it raised; ``on_nudge``:
    as ``Worker``'s); None where no child can be made (no fork, or the system refuses one). The caller ``close``s it: at
    once if it is still running, which kills it, so work that does not look at a stop flag often (eq. N21b's HiGHS
    racer) ends when it is told."""
    if not available():
        return None
    try:
        child = Worker(lambda _: fn(), on_nudge=on_nudge)
    except OSError:
        return None
    try:
        child.submit(0)
    except OSError:  # (the child already gone: a broken pipe)
        child.close()
        return None
    return child


def forks(threads: int, items: int = 2) -> bool:
    """Whether ``fork_map`` runs ``items`` items on two processes (else serially in this one)."""
    return threads >= 2 and items >= 2 and available() and cpus() >= 2 and not _forked


def fork_map(fn: Callable[[object], object], items: list, threads: int, stop: Callable[[], bool] | None = None,
             interrupt: Callable[[], object] | None = None, rerun: bool = True) -> list:
    """Eq. PAR5 (formulations/README.md): ``[fn(x) for x in items]``, the items at odd positions run by one forked
    child while this process runs the others (interleaved: where an item's cost grows along the list, the halves stay
    even). ``fn`` must be a pure function of its item and of the state at the fork (what it caches or counts in the
    child stays there); the results are those of the serial loop, in order. Serial where ``threads`` < 2, fewer than
    two items, one CPU, no fork, or in a forked child itself (never a third process on two cores). Items the child
    does not bring back (it failed or died) are run here: an error of ``fn`` then raises here as it would have
    serially. A child not back within twice this process's own time plus CHILD_SLACK_S is stopped and its items run
    here too, so a child that hangs never holds the caller. ``stop`` (looked at every POLL_S while waiting: Ctrl-C)
    nudges the child, whose ``interrupt`` (its copy of the caller's deadline's) makes ``fn`` return its best so far;
    it then gets STOP_WAIT_S. ``rerun`` False: the child's items it does not bring back give None (work bounded by a
    clock, which this process would only run again past its end)."""
    if not forks(threads, len(items)):
        return [fn(x) for x in items]
    theirs = list(range(1, len(items), 2))
    child = start(lambda: [fn(items[i]) for i in theirs], on_nudge=interrupt)
    if child is None:  # (no fork: e.g. the process limit reached) the loop runs here, as on one CPU
        return [fn(x) for x in items]
    try:
        t0 = time.monotonic()
        out = {i: fn(items[i]) for i in range(0, len(items), 2)}
        back, got = wait(child, time.monotonic() + 2 * (time.monotonic() - t0) + CHILD_SLACK_S, stop)
        if back and isinstance(got, list) and len(got) == len(theirs):
            out.update(zip(theirs, got))
    finally:
        child.close()
    return [out[i] if i in out else fn(items[i]) if rerun else None for i in range(len(items))]


def shared_queue():
    """Eq. PAR5e: an index in shared memory (made before a fork, so that both processes map it) from which ``taken``
    hands out a list's items."""
    return Value("i", 0)


def taken(items: list, queue) -> Iterator:
    """The items in turn; with ``queue`` (``shared_queue``) only those this process takes, one at a time, so that the
    processes that share it split the list as each becomes free (eq. PAR5e) rather than in fixed halves."""
    if queue is None:
        yield from items
        return
    while True:
        with queue.get_lock():
            i = queue.value
            queue.value = i + 1
        if i >= len(items):
            return
        yield items[i]


def wait(child: Worker, end: float, stop: Callable[[], bool] | None = None) -> tuple[bool, object]:
    """``child.reply`` by ``end`` (monotonic s): (True, the reply), or (False, None) when it is not back; once ``stop()``
    (looked at every POLL_S: Ctrl-C) the child is nudged and gets STOP_WAIT_S more to send its best so far."""
    nudged = False
    while True:
        if stop is not None and not nudged and stop():
            child.nudge()
            end, nudged = min(end, time.monotonic() + STOP_WAIT_S), True
        left = end - time.monotonic()
        if left <= 0:
            return False, None
        back, got = child.reply(min(left, POLL_S))
        if back:
            return True, got


def _die_with(parent: int) -> None:
    """Linux: the child is killed when the parent dies, however it dies (SIGKILL, a crash), so no worker outlives the
    command (elsewhere it ends at its next request, the pipe closed). If the parent died before this ran, leave."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _serve_all(conn: Connection, serve: Callable[[object], object]) -> None:
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        try:
            reply = serve(request)
        except BaseException as exc:  # noqa: BLE001 - the parent decides what a failure means
            reply = exc
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an exception holding an unpicklable object
            conn.send(RuntimeError(f"the node worker's reply could not be sent: {exc}"))
