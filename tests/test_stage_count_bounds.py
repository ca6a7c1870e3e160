"""Eq. N16 (formulations/README.md): the stage DPs' Lagrangian bound per stage count (``NodeBound.per_p``, the max over
every DP run of the least path of exactly P stages plus that run's multiplier terms) never exceeds the least cost of the
node's plans of P stages, by brute force on small instances, for eq. N4's bisection and eq. N11's cutting planes (with
eq. N12's GPU-time rows priced, against an oracle that meets eq. C1); and it lifts the node's bound on some stage counts
(the least of them is the node's bound; a count above it is where the node narrows or splits)."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem, variant_nodes
from test_group_split import _node_optimum

from haap_milp.solvers.common.dual_bundle import bundle_bound
from haap_milp.solvers.common.stage_dp import node_bound


def _nodes(seeds):
    for seed in seeds:
        problem = random_problem(seed, uniform=False, same_tp_first_last=False)
        for _, dp, a in variant_nodes(problem):
            if dp.k_max > dp.p_first:  # (several stage counts)
                yield problem, dp, a


@pytest.mark.parametrize("method", ["bisection", "bundle"])
def test_per_stage_count_bound_is_below_each_counts_optimum(method):
    checked = lifted = tight = 0
    for problem, dp, a in _nodes(range(50)):
        if method == "bundle":
            nb = bundle_bound(problem, dp.t, a, dp, None, None, b=dp.b)  # (eq. N12: C1's rows priced)
        else:
            nb = node_bound(problem, dp.t, a, dp.b, dp.p_first, dp.k_max, None, None, dp)
        if math.isinf(nb.bound_s):
            continue
        assert nb.per_p is not None and len(nb.per_p) == dp.k_max + 1
        assert np.all(np.isinf(nb.per_p[:dp.p_first]))
        # the node's bound is the least over its counts (each run's bound is its least count's value)
        assert min(nb.per_p) >= nb.bound_s - 1e-9 * max(1.0, abs(nb.bound_s))
        for P in range(dp.p_first, dp.k_max + 1):
            opt = _node_optimum(dp, a, gpu_time=method == "bundle", stages=P)
            val = float(nb.per_p[P])
            assert val <= opt + 1e-9 * max(1.0, abs(opt)), (P, val, opt)
            if math.isfinite(opt):
                checked += 1
                lifted += val > nb.bound_s * (1 + 1e-6)
                tight += val >= 0.98 * opt  # (a bound 2 % too high would fail on these)
    assert checked >= 30, checked
    assert lifted >= 5, (lifted, checked)
    assert tight >= 5, (tight, checked)
