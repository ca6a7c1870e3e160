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


def test_dive_order_on_an_interleaved_incumbent_takes_its_neighbours_by_m_and_stages_per_micro_batch():
    """Eq. LS4d: after an interleaved incumbent's own variant come the variants of its vpp (and vpp 1) within a factor
    DIVE_M_RATIO of its M, nearest M first, its own vpp before vpp 1, then the P / M nearest its own (twice M at twice
    P: the same GPUs at half the data parallelism); other vpps and farther M are left out. A vpp-1 incumbent keeps
    eq. LS4c's DIVE_VARIANTS of vpp 1."""
    from types import SimpleNamespace as V

    grid = [V(num_microbatches=m, vpp=1, num_stages=0) for m in (8, 16, 32, 64, 128)]
    grid += [V(num_microbatches=m, vpp=vpp, num_stages=p) for m in (16, 32, 64) for vpp in (2, 4) for p in (8, 16, 32)]
    problem = V(variants=grid)
    home = next(v for v, w in enumerate(grid) if (w.num_microbatches, w.vpp, w.num_stages) == (32, 4, 16))
    key = [(grid[v].num_microbatches, grid[v].vpp, grid[v].num_stages) for v in bb._dive_order(problem, home)]
    assert key[0] == (32, 4, 16)
    # its other stage counts, then its M at vpp 1, then M / 2 and 2 M at P / M = 1/2 as at home (before (16, 4, 16))
    assert key[1:6] == [(32, 4, 8), (32, 4, 32), (32, 1, 0), (16, 4, 8), (64, 4, 32)], key
    assert all(vpp in (1, 4) for _, vpp, _ in key) and all(16 <= m <= 64 for m, _, _ in key)
    want = {(m, vpp, p) for m, vpp, p in ((w.num_microbatches, w.vpp, w.num_stages) for w in grid)
            if vpp in (1, 4) and 16 <= m <= 64}
    assert set(key) == want and len(key) == len(want)
    flat = bb._dive_order(problem, 2)  # M = 32, vpp 1
    assert [grid[v].num_microbatches for v in flat] == [32, 16, 64] and all(grid[v].vpp == 1 for v in flat)
