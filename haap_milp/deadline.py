"""One wall-clock budget for a whole command, and Ctrl-C as "stop now, keep the best plan".

A ``Deadline`` is a point on the monotonic clock plus an interrupt flag shared by every deadline cut
from it (``cap``). The CLI makes one at command start (``Deadline.for_process``: the interpreter's own
start-up and imports count too), the planner passes it to every step (presolve, DP, uniform, the exact
search; ``use`` makes it the one ``current()`` returns inside the solvers), and the exact engines register
a stop function (``stopper``: CP-SAT ``stop_search``, HiGHS ``cancelSolve``) that ``interrupt`` calls. A
step that sees ``expired()`` returns the best it has; nothing raises.

``run_interruptible`` runs a function in a worker thread so that SIGINT reaches the main thread (a
Python signal handler cannot run while the main thread is inside C++), turns the first Ctrl-C into
``interrupt()`` and waits for the function to return its best plan; a second Ctrl-C raises.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0.0 elsewhere): interpreter start-up and imports."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5): starttime, ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def is_command_process() -> bool:
    """True when this process was started as ``haap-solve`` or ``python -m haap_milp.cli``."""
    argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return os.path.basename(argv0) == "haap-solve" or argv0.endswith(os.path.join("haap_milp", "cli", "__main__.py"))


class _Flag:
    """The interrupt state shared by a deadline and the deadlines cut from it."""

    def __init__(self, handles_sigint: bool) -> None:
        self.set = False
        self.handles_sigint = handles_sigint
        self.stops: dict[int, Callable[[], object]] = {}
        self.lock = threading.Lock()
        self.next_id = 0


class Deadline:
    """A monotonic-clock deadline (``seconds=None``: none) with a shared interrupt flag."""

    def __init__(self, seconds: float | None = None, *, start: float | None = None, handles_sigint: bool = False,
                 _flag: _Flag | None = None) -> None:
        self.start = time.monotonic() if start is None else start
        self.at = math.inf if seconds is None else self.start + float(seconds)
        self._flag = _flag or _Flag(handles_sigint)

    @classmethod
    def for_command(cls, seconds: float | None, handles_sigint: bool = True) -> Deadline:
        """The CLI's deadline: counted from the process's start when this process is the ``haap-solve``
        command (interpreter start-up and imports count), else (the CLI called in-process, tests) from now."""
        age = process_age_s() if is_command_process() else 0.0
        return cls(seconds, start=time.monotonic() - age, handles_sigint=handles_sigint)

    def cap(self, seconds: float | None) -> Deadline:
        """A deadline at most ``seconds`` from now (never later than this one), sharing its interrupt flag."""
        child = Deadline(None, start=self.start, _flag=self._flag)
        child.at = self.at if seconds is None else min(self.at, time.monotonic() + max(0.0, seconds))
        return child

    @property
    def limited(self) -> bool:
        return math.isfinite(self.at)

    @property
    def interrupted(self) -> bool:
        return self._flag.set

    @property
    def handles_sigint(self) -> bool:
        """True when Ctrl-C is routed to ``interrupt`` (the engines then leave SIGINT alone)."""
        return self._flag.handles_sigint

    def remaining(self) -> float:
        """Seconds left (0.0 once interrupted; inf without a limit)."""
        return 0.0 if self._flag.set else self.at - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def interrupt(self) -> None:
        """Stop: every step returns its best so far; registered engine stops are called now."""
        with self._flag.lock:
            self._flag.set = True
            stops = list(self._flag.stops.values())
        for stop in stops:
            with contextlib.suppress(Exception):  # an engine that already finished
                stop()

    @contextlib.contextmanager
    def stopper(self, stop: Callable[[], object]) -> Iterator[None]:
        """Call ``stop`` on ``interrupt`` while inside the block (at once if already interrupted)."""
        with self._flag.lock:
            key = self._flag.next_id
            self._flag.next_id += 1
            self._flag.stops[key] = stop
            already = self._flag.set
        if already:
            with contextlib.suppress(Exception):
                stop()
        try:
            yield
        finally:
            with self._flag.lock:
                self._flag.stops.pop(key, None)


NONE = Deadline(None)  # no limit, never interrupted (what ``current()`` gives outside ``use``)
_current: list[Deadline] = []
_lock = threading.Lock()


def current() -> Deadline:
    """The deadline of the step running now (``use``), or one without a limit."""
    return _current[-1] if _current else NONE


@contextlib.contextmanager
def use(deadline: Deadline | None) -> Iterator[Deadline]:
    """Make ``deadline`` the one ``current()`` returns inside the block (None: leave it as it is).
    Process-wide, not per thread: the CLI runs the planner in a worker thread."""
    if deadline is None:
        yield current()
        return
    with _lock:
        _current.append(deadline)
    try:
        yield deadline
    finally:
        with _lock:
            _current.remove(deadline)


def run_interruptible(fn: Callable[[], object], deadline: Deadline, on_interrupt: Callable[[], object] | None = None):
    """``fn()`` in a worker thread; the first Ctrl-C calls ``deadline.interrupt()`` (and ``on_interrupt``)
    and waits for ``fn`` to return its best, a second one raises KeyboardInterrupt."""
    box: dict = {}
    done = threading.Event()  # not Thread.join: a join interrupted by KeyboardInterrupt can leave is_alive() False

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name="haap-solve", daemon=True).start()
    while not done.is_set():
        try:
            done.wait(0.05)
        except KeyboardInterrupt:
            if deadline.interrupted:
                raise
            deadline.interrupt()
            if on_interrupt is not None:
                on_interrupt()
    if "error" in box:
        raise box["error"]
    return box["value"]
