"""What the tests of forked worker processes share (test_node_pool.py: eq. PAR2; test_late_hint.py: eq. PAR4)."""

from __future__ import annotations

import os

import pytest

from haap_milp import worker
from haap_milp.specs import SolveOptions

needs_fork = pytest.mark.skipif(not worker.available(), reason="no fork on this platform")
EXACT = SolveOptions(time_limit_s=30, relative_gap=0.0, threads=2, seed=0)  # proven optima, two threads


def gone(pid: int) -> bool:
    """No process has this pid any more (ended and reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def refuse_fork():
    """``os.fork`` as a system at its process limit answers (monkeypatched in)."""
    raise OSError(11, "Resource temporarily unavailable")
