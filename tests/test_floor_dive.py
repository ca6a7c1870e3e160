"""Eq. LS4c (the floor dive before branching) against brute force: on random three-group problems, every variant's
bound after the dive (its period floor from eq. N11b's bisection, or eq. X1's cap where no plan beats the incumbent)
stays at or below every feasible plan of that variant, in tau and in T; the plans it offers are feasible; and it is not
vacuous: it lifts some variant's period floor above eq. B2's."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import feasible_assignments, random_problem

from haap_milp import worker
from haap_milp.problem import evaluate, violations
from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.solvers.common.bounds import variant_bound
from haap_milp.solvers.common.slot_bounds import build_tables


@pytest.mark.parametrize("threads", [1, 2])
def test_floor_dive_bounds_hold_for_every_plan_and_lift_some(monkeypatch, threads):
    """``threads`` 2: eq. PAR5c, the variants past the incumbent's dived on a forked child, its floors and plan taken
    back here."""
    monkeypatch.setattr(bb, "DIVE_VARIANTS", 99)
    monkeypatch.setattr(worker, "cpus", lambda: 2)
    checked = lifted = 0
    for seed in range(30):
        problem = random_problem(seed, num_groups=3, uniform=False, same_tp_first_last=False)
        plans = list(feasible_assignments(problem))
        if not plans:
            continue
        st = bb._State(several_types=len({g.rsplit("@", 1)[0] for g in problem.groups}) > 1)
        if not st.several_types:
            continue
        worst = max(plans, key=lambda a: evaluate(problem, a))  # a loose incumbent: the caps stay high
        st.inc, st.inc_obj = worst, evaluate(problem, worst)
        vb = [variant_bound(problem, build_tables(problem, v)) for v in range(len(problem.variants))]
        before = [b.tau_lb for b in vb]
        offered = []
        real_offer = bb._State.offer
        monkeypatch.setattr(bb._State, "offer", lambda self, p, a, who: offered.append(a) or real_offer(self, p, a, who))
        bb._floor_dive(problem, st, vb, 0.0, math.inf, math.inf, "test", threads)
        monkeypatch.setattr(bb._State, "offer", real_offer)
        for a in plans:
            b = vb[a.variant]
            assert bb._steady(problem, a) >= b.tau_lb * (1 - 1e-9), (seed, a)
            assert evaluate(problem, a) >= b.total_s * (1 - 1e-9) - 1e-12, (seed, a)
        assert all(a is None or not violations(problem, a) for a in offered)
        checked += 1
        lifted += any(b.tau_lb > t * (1 + 1e-6) for b, t in zip(vb, before) if math.isfinite(b.total_s))
    assert checked >= 8 and lifted >= 2, (checked, lifted)


def test_floor_dive_on_an_interleaved_incumbent_holds_for_every_plan(monkeypatch):
    """Where the incumbent is an interleaved copy (vpp 2, 3) its own variant is dived first (eq. LS4c), with tau's
    weight M - 1/vpp (eq. I1) and the links at vpp c/2 (eq. I6): every variant's bound stays at or below its plans."""
    from dataclasses import replace

    from haap_milp.interleave import interleaved_variants

    monkeypatch.setattr(worker, "cpus", lambda: 2)
    checked = lifted = 0
    for seed in range(30):
        base = random_problem(seed, num_groups=3, num_layers=6, max_stages=4, max_options=4, uniform=False,
                              same_tp_first_last=False)
        copies = tuple(interleaved_variants(base.variants, (2, 3), base.max_stages, base.num_layers))
        if not copies:
            continue
        problem = replace(base, variants=base.variants + copies)
        plans = list(feasible_assignments(problem))
        inter = [a for a in plans if problem.variants[a.variant].vpp > 1]
        st = bb._State(several_types=len({g.rsplit("@", 1)[0] for g in problem.groups}) > 1)
        if not inter or not st.several_types:
            continue
        worst = max(inter, key=lambda a: evaluate(problem, a))
        st.inc, st.inc_obj = worst, evaluate(problem, worst)
        vb = [variant_bound(problem, build_tables(problem, v)) for v in range(len(problem.variants))]
        before = vb[worst.variant].tau_lb
        bb._floor_dive(problem, st, vb, 0.0, math.inf, math.inf, "test", 2)
        for a in plans:
            b = vb[a.variant]
            assert bb._steady(problem, a) >= b.tau_lb * (1 - 1e-9), (seed, a)
            assert evaluate(problem, a) >= b.total_s * (1 - 1e-9) - 1e-12, (seed, a)
        checked += 1
        lifted += vb[worst.variant].tau_lb > before * (1 + 1e-6)
    assert checked >= 6 and lifted >= 2, (checked, lifted)
