"""Eq. PAR4 (formulations/README.md): a warm start that arrives while the exact search runs.

The planner runs the DP heuristic on a forked worker process (``Beside``) while the exact search starts from the
uniform baseline's plan in this one; the search takes the DP's plan as an incumbent when it comes back (``take``,
polled between nodes) and keeps its node workers (eq. PAR2) unstarted until then, so that two processes, not three,
share two cores. Why: on a 2-core machine the DP ran alone for 0.5-2.4 s before the search began (measured on Sailor's
32+96 OPT-350M row: DP 0.56 s of a 2.05 s command).

The feed is a stack like ``deadline.use``: ``feeding(feed)`` makes ``feed`` what ``current()`` gives inside the block.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from haap_milp import worker
from haap_milp.problem import Assignment, RawResult


class Feed:
    """No plan to wait for (what ``current()`` gives outside ``feeding``)."""

    @property
    def pending(self) -> bool:
        return False

    def take(self) -> Assignment | None:
        """The plan that arrived since the last call (once), else None; never blocks."""
        return None


NONE = Feed()
POLL_S = worker.POLL_S  # s between looks at Ctrl-C while the planner waits for the heuristic's result
STOP_WAIT_S = worker.STOP_WAIT_S  # s an interrupted heuristic gets to send its best so far before it is killed
_feeds: list[Feed] = []


def current() -> Feed:
    return _feeds[-1] if _feeds else NONE


@contextlib.contextmanager
def feeding(feed: Feed | None) -> Iterator[Feed]:
    if feed is None:
        yield current()
        return
    _feeds.append(feed)
    try:
        yield feed
    finally:
        _feeds.remove(feed)


class Beside(Feed):
    """``run()`` (a heuristic returning a RawResult of the full problem) on a forked worker; its plan is taken once
    (``take``), its result collected with ``result`` or dropped with ``close``. ``interrupt``: what makes ``run``
    return its best so far in the child (its deadline's ``interrupt``), called there on Ctrl-C here."""

    def __init__(self, run: Callable[[], RawResult], interrupt: Callable[[], object] | None = None) -> None:
        """Raises OSError where no worker can be forked (the caller then runs ``run`` itself)."""
        child = worker.start(run, on_nudge=interrupt)
        if child is None:
            raise OSError("no forked worker for the heuristic")
        self._worker = child
        self._done, self._value, self._taken = False, None, False

    def _poll(self, timeout_s: float = 0.0) -> None:
        if not self._done:
            got, value = self._worker.reply(timeout_s)
            if got:
                self._done, self._value = True, value
                self._worker.stop()  # (reaped by ``close``: the search does not wait for the child's exit)

    @property
    def pending(self) -> bool:
        self._poll()
        return not self._done

    def take(self) -> Assignment | None:
        self._poll()
        if not self._done or self._taken or not isinstance(self._value, RawResult):
            return None
        self._taken = True
        return self._value.assignment

    def result(self, timeout_s: float, stop: Callable[[], bool] = lambda: False) -> RawResult | BaseException | None:
        """The heuristic's result (an exception if it failed or its process died), or None if it is not back within
        ``timeout_s``; once ``stop()`` is true (looked at every POLL_S: Ctrl-C) the child is interrupted and gets
        STOP_WAIT_S more to send its best so far. The worker is then killed."""
        self._poll()  # (already back: taken whatever the time left)
        if not self._done:
            self._done, self._value = worker.wait(self._worker, time.monotonic() + max(timeout_s, 0.0), stop)
        self.close()
        return self._value

    def close(self) -> None:
        self._worker.close()


class Mapped(Feed):
    """``inner``'s plans renumbered for a problem restricted to the variants ``keep`` (a plan of a variant left out:
    none)."""

    def __init__(self, inner: Feed, keep: list[int]) -> None:
        self.inner, self.keep = inner, keep

    @property
    def pending(self) -> bool:
        return self.inner.pending

    def take(self) -> Assignment | None:
        a = self.inner.take()
        if a is None or a.variant not in self.keep:
            return None
        return replace(a, variant=self.keep.index(a.variant))
