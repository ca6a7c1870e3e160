"""Eq. PAR2 (formulations/README.md): the branch and bound's nodes run by forked worker processes
(``worker.Worker``), one per thread allowed, while this process only hands out nodes and merges what
comes back.

Why processes: a node is Python (the stage DPs, the LP's model, numpy on small arrays) and holds the GIL, so two
threads would run one node at a time. Why this process runs none itself once they start: it could not hand the next
node to a worker that finished while it was inside its own (a node takes 10 ms-1 s), and on two cores two workers
already use both. Every worker starts from the search's state at the fork; each request carries the incumbent.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import wait as wait_any

from haap_milp import worker


def available() -> bool:
    """True where workers can be forked (POSIX)."""
    return worker.available()


def cpus() -> int:
    """The CPUs this process may run on (``worker.cpus``, looked up at each call: one place to patch)."""
    return worker.cpus()


class NodePool:
    """Up to ``size`` workers running ``serve(node, incumbent, its objective)``; ``submit``, then ``replies``."""

    def __init__(self, serve: Callable[[object], object], size: int) -> None:
        self.serve, self.size = serve, size
        self.workers: list[worker.Worker] = []
        self.running: dict[int, object] = {}  # worker index -> the node it runs
        self.dead: set[int] = set()  # workers that failed (stopped; given nothing more)

    @property
    def started(self) -> bool:
        return bool(self.workers)

    @property
    def busy(self) -> bool:
        return bool(self.running)

    @property
    def usable(self) -> bool:
        return len(self.dead) < len(self.workers)

    def start(self) -> None:
        """Fork the workers; those the system refuses (OSError: e.g. its process limit) are left out, and with none
        the pool stays unstarted for good (``size`` 0: the search runs its nodes in this process)."""
        for _ in range(self.size):
            try:
                self.workers.append(worker.Worker(self.serve))
            except OSError:
                break
        if not self.workers:
            self.size = 0

    def idle(self) -> int | None:
        """A worker with nothing to run, or None."""
        return next((i for i in range(len(self.workers)) if i not in self.running and i not in self.dead), None)

    def submit(self, i: int, node, request) -> None:
        self.running[i] = node
        self.workers[i].submit(request)

    def replies(self, timeout_s: float) -> list[tuple[object, object]]:
        """(node, reply) of each worker whose node is back within ``timeout_s`` (0: those back now); a worker that
        failed gives its exception as the reply and runs nothing more."""
        if not self.running:
            return []
        conns = {self.workers[i].conn: i for i in self.running}
        ready = wait_any(list(conns), timeout=max(timeout_s, 0.0))
        out = []
        for conn in ready:
            i = conns[conn]
            back, reply = self.workers[i].reply(0.0)
            if back:
                out.append((self.running.pop(i), reply))
                if isinstance(reply, BaseException):
                    self.workers[i].close()
                    self.dead.add(i)
        return out

    def drop(self) -> list:
        """Stop every worker; the nodes they still ran (to be put back open)."""
        left = list(self.running.values())
        self.running.clear()
        for w in self.workers:  # (all stopped, then all reaped: their teardowns overlap)
            w.stop()
        for w in self.workers:
            w.reap()
        self.dead = set(range(len(self.workers)))
        return left
