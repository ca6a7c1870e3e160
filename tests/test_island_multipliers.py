"""Eq. N13b (formulations/README.md, "Search"): the island cases of eq. N6 keep the stage DP's multipliers on the
groups whose summed GPUs are in their state (where eq. N10's cut could not run anyway). Against a node-level oracle
(every plan of the variant enumerated): never above the node's optimum, at least eq. N11's bound at the same
multipliers, and above the former cases (multipliers 0 on the groups) on a share of the nodes. Eq. N6c (the cases
with eq. N10's cut, each also with the multipliers kept, the larger counting; islands that hold no plan alone left
out): never above the node's optimum, never below the former cases, above them on a share of the nodes, and an island
it leaves out never holds a plan of the node."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem
from test_stage_dp import _node_plans

from haap_milp.solvers.common import capacity_dp
from haap_milp.solvers.common.bounds import variant_bound
from haap_milp.solvers.common.branch_and_bound import _worst_tau
from haap_milp.solvers.common.dual_bundle import bundle_bound, with_gpu_time
from haap_milp.solvers.common.slot_bounds import build_tables
from haap_milp.solvers.common.stage_dp import PathDP


def _island(problem, dp, t, a, nb, ends):
    return with_gpu_time(dp, t, a, nb.mu, capacity_dp.island_bound, problem, dp, a, ends, nb.mu[:len(dp.cap)])[0]


def _nodes(rng):
    """The oracle's nodes: per small random problem (one variant, every plan enumerated), four tau intervals between
    its bound and its worst period: (seed, problem, tables, a, b, [(T, plan) inside the node], stage DP, eq. N11's
    bound with eq. N12's rows priced, each group its own island)."""
    for seed in range(60):
        problem = random_problem(seed, uniform=False, same_tp_first_last=False, num_layers=int(rng.integers(4, 7)),
                                 max_stages=int(rng.integers(2, 4)), max_options=6, num_variants=1,
                                 num_groups=int(rng.integers(3, 5)))
        plans = _node_plans(problem, 0)
        if not plans:
            continue
        t0 = build_tables(problem, 0)
        vb = variant_bound(problem, t0)
        bot, top = vb.tau_lb, max(_worst_tau(t0), vb.tau_lb) * 1.01
        edges = np.sort(np.concatenate([[bot, top], rng.uniform(bot, top, 3)]))
        for a, b in itertools.pairwise(edges):
            a, b = float(a), float(b)
            t = build_tables(problem, 0, b)
            if t.p_min == 0:
                continue
            inside = [(T, x) for P, tau, T, x in plans
                      if t.p_min <= P <= t.p_max and a * (1 - 1e-12) <= tau <= b * (1 + 1e-9)]
            dp = PathDP(problem, t, b, t.p_min, t.p_max)
            nb = bundle_bound(problem, t, a, dp, None, None, b=b)  # eqs. N11, N12 (the GPU-time rows priced)
            ends = np.full(dp.E, -1)
            ends[dp.row_group] = [int(np.flatnonzero(u)[0]) for u in dp.row_usage[:, :dp.G] > 0]
            yield seed, problem, t, a, b, inside, dp, nb, ends


def test_island_cases_with_multipliers_hold_per_node_and_bind(monkeypatch):
    checked = lifted = 0
    for seed, problem, t, a, b, inside, dp, nb, ends in _nodes(np.random.default_rng(7)):
        opt = min((T for T, _ in inside), default=math.inf)
        monkeypatch.setattr(capacity_dp, "USE_INFLIGHT_CUT", False)  # so that eq. N13b runs on every node
        monkeypatch.setattr(capacity_dp, "KEEP_MU", True)
        new = _island(problem, dp, t, a, nb, ends)
        monkeypatch.setattr(capacity_dp, "KEEP_MU", False)
        monkeypatch.setattr(capacity_dp, "USE_BOTH_PRICES", False)  # (the former cases alone, not eq. N6c)
        old = _island(problem, dp, t, a, nb, ends)
        monkeypatch.setattr(capacity_dp, "USE_BOTH_PRICES", True)
        assert new <= opt * (1 + 1e-9) + 1e-12, (seed, a, b, new, opt)
        if not math.isfinite(nb.bound_s):
            continue
        checked += 1
        assert new >= nb.bound_s - 1e-9 * abs(nb.bound_s), (seed, a, b, new, nb.bound_s)
        lifted += new > old * (1 + 1e-6) + 1e-12
    assert checked >= 30 and lifted >= checked // 10, (checked, lifted)


def test_island_cases_with_both_prices_and_empty_islands_hold_per_node_and_bind(monkeypatch):
    """Eq. N6c as the search runs it (eq. N10's cut on, eq. N13b off): each group its own island (any partition is
    sound), the islands whose options alone admit no plan (eq. N11b's ray, ``_empty_islands``) left out. Fails with the
    kept multipliers' case taken instead of the larger of the two, or an island left out that holds a plan."""
    from haap_milp.solvers.common.branch_and_bound import _empty_islands

    checked = lifted = emptied = 0
    for seed, problem, t, a, b, inside, dp, nb, ends in _nodes(np.random.default_rng(11)):
        opt = min((T for T, _ in inside), default=math.inf)
        empty = _empty_islands(problem, dp, ends)
        for blk in empty:  # an island left out holds no plan of the node
            assert not any(all(ends[problem.options[s.option].group] == blk for s in x.stages) for _, x in inside)
        emptied += len(empty)
        monkeypatch.setattr(capacity_dp, "USE_BOTH_PRICES", False)
        old = with_gpu_time(dp, t, a, nb.mu, capacity_dp.island_bound, problem, dp, a, ends,
                            nb.mu[:len(dp.cap)])[0]
        monkeypatch.setattr(capacity_dp, "USE_BOTH_PRICES", True)
        new = with_gpu_time(dp, t, a, nb.mu, capacity_dp.island_bound, problem, dp, a, ends,
                            nb.mu[:len(dp.cap)], empty)[0]
        assert new <= opt * (1 + 1e-9) + 1e-12, (seed, a, b, new, opt)
        if not math.isfinite(old):
            continue
        checked += 1
        assert new >= old * (1 - 1e-12) - 1e-12, (seed, a, b, new, old)
        lifted += new > old * (1 + 1e-6) + 1e-12
    assert checked >= 30 and lifted >= checked // 10 and emptied >= 5, (checked, lifted, emptied)
