"""Eq. I2's links in the bounds and node models (``slot_bounds.link_half``): an interleaved plan crosses each boundary
vpp times per micro-batch each way, so its period is at least vpp c/2 on every link between neighbouring stages (the
wrap, last stage to first, vpp - 1 times). Checked against brute force on random two-island problems copied as
interleaved variants (vpp 2, 3) with a cross-island link of 1, 2 and 4 layer times: eq. B2's variant bound stays below
each variant's best plan and is lifted on some; on nodes tau <= b of each variant the node model (CP-SAT, exact) gives
the best plan of period <= b and the stage DPs' bound stays below it; CP-SAT and the MILP (whose stage DPs, island split
and node models read the rule) return brute force's optimum with a bound below it."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import any_interleaved_copies, assert_exact_solvers_match_brute, feasible_plans
from test_island_split import mirrored

from haap_milp.problem import Problem, evaluate
from haap_milp.solvers import cpsat, get_solver
from haap_milp.solvers.common import bounds
from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.solvers.common.bounds import VariantBound, variant_bound
from haap_milp.solvers.common.model import build_model
from haap_milp.solvers.common.slot_bounds import build_tables, link_half
from haap_milp.solvers.common.stage_dp import link_usable
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)
CROSS = (1.0, 2.0, 4.0)  # the cross-island link, in median layer times


def interleaved_islands(seed: int, cross: float) -> Problem | None:
    """Interleaved copies (vpp 2, 3; every stage count of eq. I5) of a random problem on two islands whose link takes
    ``cross`` median layer times from island "a" to "b" and 2.5 times that back (so that the wrap's own rule, vpp - 1
    transfers, can bind where a boundary's does not); None when no copy is allowed."""
    shape = {"num_layers": 6, "max_stages": 4, "max_options": 3}
    lt = float(np.median(mirrored(seed, **shape).variants[0].layer_time))
    p = mirrored(seed, cross_s=cross * lt, **shape)
    G = len(p.groups) // 2
    variants = []
    for var in p.variants:
        p2p = var.p2p_time.copy()
        p2p[G:, :G] *= 2.5
        variants.append(replace(var, p2p_time=p2p))
    vs = tuple(any_interleaved_copies(variants, (2, 3), p.max_stages, p.num_layers))
    return replace(p, variants=vs) if vs else None


def instances(seeds: int):
    """(seed, cross, problem) of ``interleaved_islands`` for the first ``seeds`` seeds and each link of CROSS."""
    for seed in range(seeds):
        for cross in CROSS:
            p = interleaved_islands(seed, cross)
            if p is not None:
                yield seed, cross, p


def test_link_usable_counts_each_crossing():
    c = np.array([[0.0, 2.0], [2.0, 0.0]])
    assert link_usable(c, 1.0, 1).all()  # c/2 = 1 <= b
    assert not link_usable(c, 1.5, 2)[0, 1] and link_usable(c, 2.0, 2)[0, 1]  # vpp c/2 = 2
    assert link_usable(c, 3.0, 3)[0, 1] and not link_usable(c, 2.9, 3)[0, 1]
    assert (link_half(c, 3) == 1.5 * c).all() and (link_half(c, 0) == c / 2).all()


def test_variant_bound_is_below_every_plan_and_lifted_on_some(monkeypatch):
    lifted = total = 0
    for seed, cross, p in instances(8):
        for v in range(len(p.variants)):
            sub = replace(p, variants=(p.variants[v],))
            brute = get_solver("brute")(sub, EXACT)
            new = variant_bound(sub, build_tables(sub, 0)).total_s
            if brute.status == "OPTIMAL":
                assert new <= brute.objective_s * (1 + 1e-9), (seed, cross, v)
            with monkeypatch.context() as m:  # each link at c/2, as every 1F1B plan
                m.setattr(bounds, "link_half", lambda p2p, vpp: link_half(p2p, 1))
                old = variant_bound(sub, build_tables(sub, 0)).total_s
            assert new >= old
            lifted += new > old * (1 + 1e-9)
            total += 1
    assert total >= 60 and lifted >= total // 4, (lifted, total)  # 34 of 90 when written


@pytest.mark.parametrize("cross", CROSS)
def test_exact_solvers_keep_brute_force_optimum(cross):
    proven = 0
    for seed in range(8):
        p = interleaved_islands(seed, cross)
        if p is None:
            continue
        proven += assert_exact_solvers_match_brute(p, EXACT, check_bound=True).status == "OPTIMAL"
    assert proven >= 6, proven


def _node_optimum(p: Problem, v: int, b: float) -> tuple[float, float]:
    """(CP-SAT's optimum of the node model of variant v at tau <= b, inf when infeasible; the stage DPs' bound)."""
    t = build_tables(p, v, b)
    if t.p_min == 0:
        return math.inf, math.inf
    dp_bound = bb._dp_bounds(p, EXACT, bb._State(), t, 0.0, b, -math.inf, None, None, "test")[0]
    res = cpsat._solve_node(p, build_model(p, t), VariantBound(0.0, 0.0, 0.0), None, 20.0, None, EXACT)
    assert res.status in ("OPTIMAL", "INFEASIBLE"), res.status
    return (evaluate(p, res.assignment) if res.status == "OPTIMAL" else math.inf), dp_bound


def test_node_models_and_stage_dps_at_tau_caps_between_the_plans_periods():
    """Each cap b lies midway between two neighbouring periods of the variant's plans, so no plan sits at the edge
    of eq. X1's tolerance; the plans that cross the islands have periods set by their links, which the caps cut."""
    checked = binding = 0
    for seed, cross, p in instances(4):
        plans = list(feasible_plans(p))
        for v in range(len(p.variants)):
            pts = sorted((bb._steady(p, a), evaluate(p, a)) for a in plans if a.variant == v)
            if not pts:
                continue
            top = min(pts, key=lambda x: x[1])[0]  # the best plan's period: caps below it bind
            periods = sorted({round(tau, 12) for tau, _ in pts if tau <= top * (1 + 1e-9)} | {2 * top})
            edges = list(itertools.pairwise(periods))
            for lo, hi in edges[:: max(1, len(edges) // 4)]:
                b = (lo + hi) / 2
                best = min((T for tau, T in pts if tau <= b), default=math.inf)
                got, dp_bound = _node_optimum(p, v, b)
                assert got == pytest.approx(best, rel=1e-6) or got == best == math.inf, (seed, cross, v, b)
                assert dp_bound <= best * (1 + 1e-9), (seed, cross, v, b)
                checked += 1
                binding += b < top
    assert checked >= 40 and binding >= 20, (checked, binding)
