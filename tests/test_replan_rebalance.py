"""Eq. MG4: re-planning's re-balanced warm start is the least max stage time over every layer split of the
same stages that fits memory (exhaustive check on the tiny problems of tests/spec_oracle.py)."""

from __future__ import annotations

import itertools
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_frontier import _setup

from haap_milp.problem import Assignment, Stage, stage_times, violations
from haap_milp.replan import rebalance
from haap_milp.solvers import brute


def test_rebalance_is_the_least_slowest_stage_over_every_split():
    seen = 0
    for name in ("two-islands", "roomy"):
        prob = _setup(name)[3].presolved.problem
        for v, var in enumerate(prob.variants):
            ok = np.flatnonzero(var.allowed)
            for p in (2, 3):
                for combo in itertools.product(ok, repeat=p):
                    splits = [Assignment(v, tuple(Stage(int(o), int(n)) for o, n in zip(combo, comp)))
                              for comp in brute.compositions(prob.num_layers, p)]
                    # the layer splits that fit memory (GPU counts and rules do not depend on the split)
                    fit = [a for a in splits if not [x for x in violations(prob, a) if "GiB" in x]]
                    got = rebalance(prob, splits[0])
                    if not fit:
                        assert got is None
                        continue
                    assert got is not None and not [x for x in violations(prob, got) if "GiB" in x]
                    assert sum(s.num_layers for s in got.stages) == prob.num_layers
                    best = min(max(stage_times(prob, a)) for a in fit)
                    assert max(stage_times(prob, got)) <= best * (1 + 1e-12)
                    seen += 1
    assert seen > 20
