"""Eqs. CD1-CD5 (haap_milp/cost_dp.py) against exhaustive enumeration.

On random tiny Problems (tests/synthetic.py; 1F1B, blocking sends, interleaved copies), with random per-option
rates and dynamic powers, every feasible plan is enumerated and priced exactly as the band search prices it
(``frontier.plan_value``: R T + M sum_j rho_j t_j, eq. E4). The stage-additive bound must not exceed any plan of
its interval (the plans whose steady period lies in [a, b], whose rate lies in [r_lo, r_hi] and whose options are
all usable); the refined bound (eq. CD5) must not exceed the optimum, and the paths it returns must be feasible plans
priced at least the bound. Tightness is asserted on the band search's tiny catalog cases (tests/test_band_search.py),
where the enumerated optimum is known: the random problems bind on their few GPUs and slow links, which the bound
leaves out (measured there: 0.45-1.0 of the optimum)."""

from __future__ import annotations

import functools
import pathlib
import sys
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import feasible_assignments, random_problem

from haap_milp import cost_dp, frontier
from haap_milp.interleave import interleaved_variants
from haap_milp.pipeline import BWD_SHARE, exposed_sync, interleaved_period, steady_period, sync_share
from haap_milp.problem import boundary_times, stage_times, sync_times, violations, wrap_time


def _period(prob, a) -> float:
    v = prob.variants[a.variant]
    t, c = stage_times(prob, a), boundary_times(prob, a)
    if v.vpp > 1:
        return interleaved_period(t, c, v.num_microbatches, v.vpp, wrap_time(prob, a))
    return steady_period(t, c, v.num_microbatches, blocking=prob.p2p_blocking)


@functools.cache
def _case(seed: int):
    rng = np.random.default_rng(seed)
    prob = random_problem(seed, num_layers=int(rng.integers(4, 8)), max_stages=int(rng.integers(2, 5)))
    if seed % 3 == 1:
        prob = replace(prob, p2p_blocking=True)
    if seed % 3 == 2:  # interleaved copies beside the plain variants (eq. I5 fixes their stage counts)
        extra = interleaved_variants(prob.variants, (2,), prob.max_stages, prob.num_layers)
        prob = replace(prob, variants=tuple(prob.variants) + tuple(extra))
    rate = rng.uniform(0.2, 3.0, prob.num_options) * np.array([o.num_gpus for o in prob.options])
    rho = rng.uniform(0.0, 2.0, prob.num_options) if seed % 2 else np.zeros(prob.num_options)
    plans = list(feasible_assignments(prob))
    return prob, rate, rho, plans if len(plans) <= 20000 else []  # the interval test prices each plan per interval


def _value(prob, a, rate, rho) -> float:
    return frontier.plan_value(prob, a, rate, rho)


SEEDS = [s for s in range(18) if s not in (4, 5, 10, 15)]  # 4, 5, 15: > 20000 plans; 10: 3 s to enumerate


@pytest.mark.parametrize("seed", SEEDS)
def test_interval_bound_never_exceeds_a_plan_of_its_interval(seed):
    prob, rate, rho, plans = _case(seed)
    if not plans:
        pytest.skip("no feasible plan")
    rng = np.random.default_rng(100 + seed)
    dps = cost_dp.variant_dps(prob, rate, rho)
    info = [(a, _period(prob, a), float(sum(rate[s.option] for s in a.stages)), _value(prob, a, rate, rho))
            for a in plans]
    taus = np.array([x[1] for x in info])
    for _ in range(12):
        lo, hi = sorted(rng.uniform(0.5, 1.5, 2) * rng.choice(taus))
        r_lo = float(rng.uniform(0, 1) * max(x[2] for x in info)) if rng.random() < 0.5 else None
        usable = rng.random(prob.num_options) < 0.8 if rng.random() < 0.3 else None
        rates = [x[2] for x in info]
        r_hi = float(rng.uniform(min(rates), max(rates))) if rng.random() < 0.5 else np.inf  # eq. CD3b
        for v, dp in enumerate(dps):
            inside = [val for a, tau, r, val in info
                      if a.variant == v and lo <= tau <= hi and (r_lo is None or r >= r_lo) and r <= r_hi
                      and (usable is None or all(usable[s.option] for s in a.stages))]
            x, path = dp.bound(lo, hi, dp.prepare(r_lo, usable, r_hi))
            if inside:
                assert x <= min(inside) * (1 + 1e-9), (seed, v, lo, hi, r_lo)
            if path is not None and not violations(prob, path) and lo <= _period(prob, path) <= hi and \
                    (r_lo is None or r_lo <= sum(rate[s.option] for s in path.stages) <= r_hi):
                assert _value(prob, path, rate, rho) >= x * (1 - 1e-9)  # a plan of the interval


@pytest.mark.parametrize("seed", SEEDS)
def test_refined_bound_is_below_the_optimum_and_close_to_it(seed):
    prob, rate, rho, plans = _case(seed)
    if not plans:
        pytest.skip("no feasible plan")
    values = {a: _value(prob, a, rate, rho) for a in plans}
    opt = min(values.values())
    r_floor = min(float(sum(rate[s.option] for s in a.stages)) for a in plans)
    r_top = max(float(sum(rate[s.option] for s in a.stages)) for a in plans)
    got = cost_dp.cost_bound(cost_dp.variant_dps(prob, rate, rho), opt * 1.5, r_lo=r_floor, r_hi=r_top)
    assert got.complete
    assert got.value <= opt * (1 + 1e-9)
    for a in got.plans:
        assert not violations(prob, a)
        assert values[a] >= got.value * (1 - 1e-9)


@pytest.mark.parametrize(("name", "measure", "floor"), [("two-islands", "cost", 0.89), ("roomy", "cost", 0.999),
                                                         ("roomy", "energy", 0.95), ("two-islands", "energy", 0.62)])
def test_bound_is_close_to_the_enumerated_optimum_on_the_catalog_cases(name, measure, floor):
    """Measured (2026-12-03): cost 0.896-1.0 of the optimum, energy 0.96-0.98 on the roomy cluster and 0.66-0.84 on
    the two-island one (6 + 9 GPUs over a 5 Gb/s link: the links and GPU rows the bound leaves out bind); 0.646-0.844
    there since eq. T2's window rows (2026-12-07: the optimum pays its slow link in a two-stage window)."""
    from test_band_search import BOOKS, _ctx

    ctx = _ctx(name, "cpsat")
    prob = ctx.presolved.problem
    types = [g.gpu_type for g in ctx.presolved.groups]
    for book in BOOKS.values():
        rate, rho = frontier._rate_terms(prob, types, book, measure)
        plans = list(feasible_assignments(prob))
        opt = min(_value(prob, a, rate, rho) for a in plans)
        r_floor = min(float(sum(rate[s.option] for s in a.stages)) for a in plans)
        got = cost_dp.cost_bound(cost_dp.variant_dps(prob, rate, rho), opt * 1.01, r_lo=r_floor)
        assert floor * opt <= got.value <= opt * (1 + 1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_bound_at_each_plans_own_period_rate_and_options_never_exceeds_it(seed):
    """The sharpest interval for a plan: [tau, tau], R_lo = R_hi = its rate, only its own options usable. The
    bound is then close to the plan's value (a loose check would pass anything), and must not exceed it."""
    prob, rate, rho, plans = _case(seed)
    if not plans:
        pytest.skip("no feasible plan")
    dps = cost_dp.variant_dps(prob, rate, rho)
    rng = np.random.default_rng(200 + seed)
    pick = rng.choice(len(plans), size=min(40, len(plans)), replace=False)
    ratios = []
    for i in pick:
        a = plans[int(i)]
        tau, r = _period(prob, a), float(sum(rate[s.option] for s in a.stages))
        usable = np.zeros(prob.num_options, bool)
        usable[[s.option for s in a.stages]] = True
        val = _value(prob, a, rate, rho)
        dp = dps[a.variant]
        x, _ = dp.bound(tau, tau, dp.prepare(r, usable, r * (1 + 1e-12)))
        y, _ = dp.bound(tau, tau, dp.prepare(None, usable, r * (1 + 1e-12)))
        assert max(x, y) <= val * (1 + 1e-9), (seed, a, max(x, y) / val)
        ratios.append(max(x, y) / val)
        # eq. CD7's two cases at the plan's own sigma: the plan is among case B's paths (every s_j below theta + beta'
        # j b), and case A (sigma >= theta) bounds it with r_lo theta in place of the first stage's sync
        v = prob.variants[a.variant]
        beta = BWD_SHARE / v.vpp if v.vpp > 1 else sync_share(prob.p2p_blocking)
        sigma = exposed_sync(stage_times(prob, a), sync_times(prob, a), beta)
        z, _ = dp.bound(tau, tau, dp.prepare(r, usable, r * (1 + 1e-12)), sync_cap=sigma * (1 + 1e-9) + 1e-12)
        assert z <= val * (1 + 1e-9), (seed, a, z / val)
        q, _ = dp.bound(tau, tau, dp.prepare(r, usable, r * (1 + 1e-12), first_sync=False))
        assert q + r * sigma <= val * (1 + 1e-9), (seed, a, (q + r * sigma) / val)
    assert max(ratios) > 0.8  # the check bites: some plan is bounded within 20 % (measured 0.86-1.0 per seed)


def test_a_deadline_that_has_passed_leaves_a_valid_bound_and_says_so():
    """Variants not reached before the deadline count with their given floor, else 0: the value stays a bound."""
    from haap_milp.deadline import Deadline

    prob, rate, rho, plans = _case(3)
    opt = min(_value(prob, a, rate, rho) for a in plans)
    dps = cost_dp.variant_dps(prob, rate, rho)
    got = cost_dp.cost_bound(dps, opt * 1.5, deadline=Deadline(0.0))
    assert not got.complete and got.value == 0.0
    whole = cost_dp.cost_bound(dps, opt * 1.5)
    again = cost_dp.cost_bound(dps, opt * 1.5, deadline=Deadline(0.0), floors=whole.floors)
    assert not again.complete and again.value == pytest.approx(whole.value) and again.value <= opt * (1 + 1e-9)
