"""Eq. N19 (reduced-cost fixing of tau, solvers/common/lp.py ``tau_cap``) against brute force: on random problems,
no plan of a node below the cut-off has its period above the cap, and the cap cuts nodes."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import feasible_assignments, random_problem

from haap_milp.problem import evaluate
from haap_milp.solvers.common import build_model, build_tables
from haap_milp.solvers.common.branch_and_bound import _steady, _worst_tau
from haap_milp.solvers.common.lp import lp_relaxation, tau_cap


def _nodes(problem, plans):
    """Per variant, its tau range in four intervals, and the (tau, T) of its plans."""
    for v in range(len(problem.variants)):
        pts = [(_steady(problem, a), evaluate(problem, a)) for a in plans if a.variant == v]
        if not pts or problem.variants[v].num_microbatches < 2:
            continue
        lo, hi = min(p[0] for p in pts), _worst_tau(build_tables(problem, v))
        edges = np.linspace(lo * 0.999, max(hi, lo) * 1.001, 5)
        for a, b in zip(edges[:-1], edges[1:]):
            yield v, float(a), float(b), pts


def _check(seed: int) -> int:
    """Asserts the cap on every node of the seed's problem; returns how many nodes it cut."""
    problem = random_problem(seed, num_layers=6, max_stages=3)
    plans = list(feasible_assignments(problem))
    cut = 0
    for v, a, b, pts in _nodes(problem, plans):
        t = build_tables(problem, v, b)
        if t.p_min == 0:
            continue
        lm = build_model(problem, t, tau_lb=a)
        inside = sorted(T for tau, T in pts if a <= tau <= b)
        for cutoff in ([inside[0] * 1.001, inside[len(inside) // 2]] if inside else [2 * min(T for _, T in pts)]):
            lpr = lp_relaxation(lm, cutoff)
            assert lpr is not None
            if not math.isfinite(lpr.value) or lpr.value >= cutoff:
                assert all(T >= cutoff * (1 - 1e-9) for T in inside)  # the LP's own prune
                continue
            cap = tau_cap(lpr, lm, cutoff)
            for tau, T in pts:
                if a <= tau <= b and T < cutoff:
                    assert tau <= cap, (v, a, b, cutoff, tau, T, cap, lpr)
            cut += cap < b
    return cut


def test_no_plan_below_the_cutoff_lies_above_the_tau_cap_and_the_cap_binds():
    """The oracle is not vacuous: across the seeds the cap cuts the tau range of many nodes."""
    cuts = [_check(seed) for seed in range(12)]
    assert sum(cuts) >= 10, cuts
