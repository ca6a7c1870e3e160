"""Direct tests of solvers/common: the LinModel's objective and warm-start completion, the HiGHS model
builder and the LP bound (lp.py), the local search (polish.py), the canonical form of a hint (hints.py),
and the MILP's CBC fallback."""

from __future__ import annotations

import copy
import math
import pathlib
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import large_problem, random_problem

from haap_milp.interleave import interleaved_variants
from haap_milp.problem import Assignment, Stage, evaluate, violations
from haap_milp.solvers import get_solver, milp
from haap_milp.solvers.common import branch_and_bound, build_model, build_tables, canonical, decode, hint_values
from haap_milp.solvers.common import polish as polish_mod
from haap_milp.solvers.common.lp import highs_model, highspy, lp_bound, run
from haap_milp.solvers.common.model import Row, start_values
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=2, seed=0)
SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow]}


def _random_plan(problem, rng) -> Assignment:
    """Any plan shape (feasible or not): a variant, a stage count, a split of the layers, options."""
    v = int(rng.integers(len(problem.variants)))
    p = int(rng.integers(1, min(problem.max_stages, problem.num_layers) + 1))
    cuts = sorted(rng.choice(np.arange(1, problem.num_layers), size=p - 1, replace=False).tolist()) if p > 1 else []
    sizes = np.diff([0, *cuts, problem.num_layers]).tolist()
    allowed = np.flatnonzero(problem.variants[v].allowed)
    return Assignment(v, tuple(Stage(int(rng.choice(allowed)), int(n)) for n in sizes))


def _feasible_plans(problem, rng, tries: int = 300) -> list[Assignment]:
    out = []
    for _ in range(tries):
        a = _random_plan(problem, rng)
        if not violations(problem, a):
            out.append(a)
    return out


def _row_ok(row, vals, tol=1e-7) -> bool:
    act = sum(c * vals[i] for i, c in zip(row.idx, row.coef)) + row.const
    scale = max(1.0, sum(abs(c * vals[i]) for i, c in zip(row.idx, row.coef)))
    return row.lb - tol * scale <= act <= row.ub + tol * scale


def _model_value(lm, vals) -> float:
    obj, const = lm.objective()
    return sum(c * vals[i] for i, c in obj.items()) + const


# --- LinModel: objective and warm-start completion (model.py), canonical form (hints.py) ---------------

@settings(max_examples=40, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_completed_hint_is_feasible_and_its_objective_is_evaluate(seed):
    """Any feasible plan, put in canonical form (hints.py), is a point of its variant's model: every row,
    bound and integrality holds, the model's objective (eq. T1) equals evaluate(), and decode gives it back."""
    problem = random_problem(seed)
    dp = get_solver("dp")(problem, EXACT).assignment
    for a in _feasible_plans(problem, np.random.default_rng(seed))[:5] + ([dp] if dp is not None else []):
        t = build_tables(problem, a.variant)
        c = canonical(problem, t, a)
        assert not violations(problem, c)
        assert evaluate(problem, c) <= evaluate(problem, a) * (1 + 1e-12)
        lm = build_model(problem, t)
        vals = start_values(lm, c)
        assert vals is not None, c
        assert set(vals) == set(range(len(lm.names)))
        for i, x in vals.items():
            assert lm.lb[i] - 1e-9 <= x <= lm.ub[i] + 1e-9, (lm.names[i], x)
            if lm.integer[i]:
                assert x == round(x), (lm.names[i], x)
        bad = [r.label for r in lm.rows if not _row_ok(r, vals)]
        assert not bad, bad
        assert _model_value(lm, vals) == pytest.approx(evaluate(problem, c), rel=1e-9)
        assert decode(lm, [vals[i] for i in range(len(lm.names))]) == c


def test_completion_does_not_read_row_labels():
    """The time variables are found by structure (Row.defines), not by the label's equation prefix."""
    problem = random_problem(7, num_layers=8, max_stages=3)
    a = get_solver("brute")(problem, EXACT).assignment
    t = build_tables(problem, a.variant)
    a = canonical(problem, t, a)
    lm = build_model(problem, t)
    want = start_values(lm, a)
    for row in lm.rows:
        row.label = "renamed"
    assert start_values(lm, a) == want
    assert want[lm.tau] > 0 and want[lm.sigma] > 0
    assert {r.defines for r in lm.rows if r.kind == "tdef"} == {lm.tau, lm.sigma}


def test_completion_is_the_least_value_of_the_time_variables():
    """tau and sigma are completed at the maxima of their rows: each has a row that holds with equality
    (or sits at its lower bound), so the model objective is no larger than needed."""
    problem = random_problem(11, num_layers=8, max_stages=3)
    a = get_solver("brute")(problem, EXACT).assignment
    t = build_tables(problem, a.variant)
    lm = build_model(problem, t)
    vals = start_values(lm, canonical(problem, t, a))
    for v in lm.aux:
        slack = [-(sum(c * vals[i] for i, c in zip(r.idx, r.coef)) + r.const) for r in lm.rows if r.defines == v]
        assert min(slack) == pytest.approx(0.0, abs=1e-12) or vals[v] == lm.lb[v]


def test_hint_outside_the_model_is_refused():
    problem = random_problem(3, num_layers=6, max_stages=3)
    t = build_tables(problem, 0)
    lm = build_model(problem, t)
    deep = Assignment(0, tuple(Stage(int(t.opts[0]), 1) for _ in range(t.p_max + 1)))  # no slot p_max + 1
    assert hint_values(lm, deep) is None and start_values(lm, deep) is None


@pytest.mark.parametrize("seed", range(8))
def test_canonical_form_is_a_fixed_point(seed):
    problem = random_problem(seed)
    for a in _feasible_plans(problem, np.random.default_rng(seed))[:5]:
        t = build_tables(problem, a.variant)
        c = canonical(problem, t, a)
        assert canonical(problem, t, c) == c


# --- LP relaxation and the shared HiGHS builder (lp.py) -----------------------------------------------

def _milp(lm):
    """(objective, decoded plan) of the builder's model with integrality on, solved to optimality."""
    h = highs_model(lm, integer=True)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    run(h)
    if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return math.inf, None
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return h.getInfo().objective_function_value + lm.obj_const, decode(lm, list(h.getSolution().col_value))


@settings(max_examples=40, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_lp_bound_below_brute_force_and_integral_model_equals_it(seed):
    """Per variant, LP <= MILP of the same builder; the best MILP plan over the variants is a brute-force
    optimum (so the builder's rows and objective are those of eqs. T1-T3), and the LP is below it."""
    problem = random_problem(seed)
    brute = get_solver("brute")(problem, EXACT)
    lps, mips = [], []
    for v in range(len(problem.variants)):
        t = build_tables(problem, v)
        if t.p_min == 0:
            continue
        lm = build_model(problem, t)
        lp, (mip, plan) = lp_bound(lm), _milp(lm)
        assert lp is not None
        assert lp <= mip * (1 + 1e-9) + 1e-12
        lps.append(lp)
        if plan is not None:
            assert not violations(problem, plan)
            # HiGHS' value is within its feasibility tolerances (1e-7 per row, up to M - 1 periods) of the plan's
            assert mip == pytest.approx(evaluate(problem, plan), abs=1e-7 * (t.M + 2) * (1 + t.L))
            mips.append((evaluate(problem, plan), mip))
    if brute.status == "INFEASIBLE":
        assert not mips
        return
    assert min(lps) <= brute.objective_s * (1 + 1e-9)
    best = min(mips)
    assert best[0] <= brute.objective_s + 1e-6 * brute.objective_s  # HiGHS: optimal within mip tolerances
    assert best[0] >= brute.objective_s * (1 - 1e-12)


def test_lp_cutoff_below_the_optimum_is_infeasible():
    problem = random_problem(5, num_layers=8, max_stages=3)
    brute = get_solver("brute")(problem, EXACT)
    a = brute.assignment
    lm = build_model(problem, build_tables(problem, a.variant))
    lp = lp_bound(lm)
    assert lp_bound(lm, cutoff_s=lp * 0.5) == math.inf
    assert lp_bound(lm, cutoff_s=brute.objective_s) == pytest.approx(lp, rel=1e-9)


def _dense(lm):
    """The same model with every row's terms written out and no expressions (the form before eq. N2c)."""
    d = copy.copy(lm)
    d.rows = [Row([(dict(zip(r.idx, r.coef)), 1.0)], r.lb, r.ub, r.kind, r.const, r.label, r.defines, [])
              for r in lm.rows]
    d.exprs = []
    return d


@settings(max_examples=25, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1), vpp=st.sampled_from([1, 2, 3]))
def test_named_expressions_are_the_dense_rows_and_keep_the_lp(seed, vpp):
    """Eq. N2c: each row's own terms plus its named expressions (each times its scale) are its dense terms, which the
    engines read; HiGHS' LP with the expressions as columns has the value of the LP of the dense rows, with and
    without a cut-off. Plain and interleaved variants (eqs. T2, T3, I3 name slot times and links)."""
    problem = random_problem(seed, num_layers=6, max_stages=4, max_options=4)
    if vpp > 1:
        extra = interleaved_variants(problem.variants, (vpp,), problem.max_stages, problem.num_layers)
        problem = replace(problem, variants=tuple(extra) or problem.variants)
    named = 0
    for v in range(len(problem.variants)):
        t = build_tables(problem, v)
        if t.p_min == 0:
            continue
        lm = build_model(problem, t)
        for row in lm.rows:
            own, refs = row.sparse()
            named += bool(refs)
            full = dict(own)
            for e, scale in refs.items():
                for var, c in lm.exprs[e].items():
                    full[var] = full.get(var, 0.0) + scale * c
            dense = dict(zip(row.idx, row.coef))
            assert {k for k, c in full.items() if abs(c) > 1e-15} == set(dense)
            assert all(full[k] == pytest.approx(c, rel=1e-12, abs=1e-18) for k, c in dense.items())
        lp, ref = lp_bound(lm), lp_bound(_dense(lm))
        assert lp == pytest.approx(ref, rel=1e-9, abs=1e-12)
        if math.isfinite(ref):
            for cut in (0.9 * ref, 1.1 * ref):
                assert lp_bound(lm, cutoff_s=cut) == pytest.approx(lp_bound(_dense(lm), cutoff_s=cut), rel=1e-9)
    assume(named > 0)  # (a model of one slot has no row that sums slots)


# --- local search (polish.py) -------------------------------------------------------------------------

@settings(max_examples=30, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_polish_never_worse_never_infeasible_and_deterministic(seed):
    problem = random_problem(seed)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        a = _random_plan(problem, rng)
        b = polish_mod.polish(problem, a)
        if violations(problem, a):
            assert b == a  # an infeasible plan is returned as given
            continue
        assert not violations(problem, b)
        assert evaluate(problem, b) <= evaluate(problem, a)
        assert polish_mod.polish(problem, a) == b


def test_polish_is_bounded_by_moves_not_by_the_clock(monkeypatch):
    """Same plan with a clock that jumps an hour per reading (a loaded machine), and at most max_moves
    candidates are looked at."""
    problem = large_problem(0, num_gpus=256, num_types=2, num_layers=32)
    a = get_solver("uniform")(problem, SolveOptions(time_limit_s=10)).assignment
    want = polish_mod.polish(problem, a, max_moves=2000)
    assert evaluate(problem, want) < evaluate(problem, a)  # the search does move from this start
    import time as _time
    clock = iter(range(0, 10**9, 3600))
    monkeypatch.setattr(_time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(_time, "monotonic", lambda: float(next(clock)))
    assert polish_mod.polish(problem, a, max_moves=2000) == want
    monkeypatch.undo()
    seen = []
    real = polish_mod._feasible_better
    monkeypatch.setattr(polish_mod, "_feasible_better", lambda *args: seen.append(1) or real(*args))
    for budget in (0, 1, 50, 400):
        seen.clear()
        b = polish_mod.polish(problem, a, max_moves=budget)
        assert len(seen) <= budget
        assert not violations(problem, b) and evaluate(problem, b) <= evaluate(problem, a)
    assert polish_mod.polish(problem, a, max_moves=0) == a


def test_polish_screen_never_rejects_a_better_candidate_and_keeps_the_plans(monkeypatch):
    """polish._no_better (the (M - 1) max t + sum t screen before ``evaluate``; interleaved, (M - 1/vpp) max t +
    sum t / vpp) holds for every candidate at its own objective (never True at a limit just above it under 1F1B;
    eqs. T1, I1 in floating point), is True on a good share of the moves it is asked about, plain and interleaved,
    and polish returns the same plans with the screen off; large problems of 2-3 types."""
    screened = asked = 0
    real = polish_mod._no_better
    monkeypatch.setattr(polish_mod, "FAST_SCREEN", False)  # (eq. LS1g would take most of its candidates first)

    def count(problem, a, limit):
        nonlocal screened, asked
        got = real(problem, a, limit)
        asked += 1
        screened += got
        obj = evaluate(problem, a)
        assert not (got and obj < limit), (obj, limit)
        assert not real(problem, a, obj * (1 + 1e-15) + 1e-300) or problem.variants[a.variant].vpp > 1
        return got

    per_vpp = {1: [0, 0], 4: [0, 0]}
    for seed, types, vpp in ((0, 2, 1), (1, 3, 1), (0, 2, 4), (1, 3, 4)):
        problem = large_problem(seed, num_gpus=256, num_types=types, num_layers=32)
        if vpp > 1:  # interleaved copies only (eq. I1's screen), P = 8
            copies = [v for v in interleaved_variants(problem.variants, (vpp,), problem.max_stages, 32)
                      if v.num_stages == 8]
            problem = replace(problem, variants=tuple(copies))
        start = "uniform" if vpp == 1 else "dp"  # (the uniform baseline leaves interleaved copies out)
        a = get_solver(start)(problem, SolveOptions(time_limit_s=10)).assignment
        assert a is not None and problem.variants[a.variant].vpp == vpp
        before = (screened, asked)
        monkeypatch.setattr(polish_mod, "_no_better", count)
        with_screen = polish_mod.polish(problem, a, max_moves=3000)
        monkeypatch.setattr(polish_mod, "_no_better", lambda *args: False)
        assert polish_mod.polish(problem, a, max_moves=3000) == with_screen
        per_vpp[vpp][0] += screened - before[0]
        per_vpp[vpp][1] += asked - before[1]
    for vpp, (scr, ask) in per_vpp.items():
        assert ask >= 500 and scr >= ask // 4, (vpp, scr, ask)


def test_sigma_screen_claims_more_and_never_a_better_candidate(monkeypatch):
    """Eq. LS1h: with sigma (eqs. T3 / I1) added, ``_no_better`` claims every candidate it claimed without it and more
    (the same walk: the screen changes no plan), and never one whose ``evaluate`` is below the limit; with large syncs
    it claims more than 3 % more (8 % when written; 4.3 % since eq. T2's windows, whose plans differ)."""
    real = polish_mod._no_better
    monkeypatch.setattr(polish_mod, "FAST_SCREEN", False)
    seen = {True: 0, False: 0}

    def both(problem, a, limit):
        got = {}
        for on in (False, True):
            monkeypatch.setattr(polish_mod, "SCREEN_SIGMA", on)
            got[on] = real(problem, a, limit)
            seen[on] += got[on]
        assert got[True] >= got[False]
        assert not (got[True] and evaluate(problem, a) < limit)
        return got[True]

    monkeypatch.setattr(polish_mod, "_no_better", both)
    for seed, types, vpp in ((0, 2, 1), (1, 3, 1), (1, 3, 4)):
        problem = large_problem(seed, num_gpus=256, num_types=types, num_layers=32)
        if vpp > 1:
            problem = replace(problem, variants=tuple(
                v for v in interleaved_variants(problem.variants, (vpp,), problem.max_stages, 32) if v.num_stages == 8))
        # syncs 10x (an MoE's expert gradients over a wide dp: qwen3-235b-a22b x hetero3-4096 syncs about a tenth of T)
        problem = replace(problem, variants=tuple(replace(v, **{k: getattr(v, k) * 10.0 for k in (
            "sync_fixed", "sync_per_layer", "sync_first", "sync_last")}) for v in problem.variants))
        a = get_solver("uniform" if vpp == 1 else "dp")(problem, SolveOptions(time_limit_s=10)).assignment
        polish_mod.polish(problem, a, max_moves=3000)
    assert seen[True] > seen[False] * 1.03, seen


def test_fast_screen_claims_only_what_the_screen_rules_out_and_keeps_plans_and_counts(monkeypatch):
    """Eq. LS1g (``polish._Screen``): every option or layer move it claims, ``_no_better`` rules out at the walk's
    limit or (eq. LS1i) it takes more GPUs of a group than there are (``violations``' eq. G1 row), plain and
    interleaved; it claims a good share of them, some by their GPUs alone; and polish with it off gives the same plan,
    the same count of candidates tried and the same local-optimum flag, at several budgets (large problems of 2-3
    types)."""
    claimed = asked = by_gpus = 0
    for seed, types, vpp, start in ((0, 2, 1, "uniform"), (1, 3, 1, "uniform"), (0, 2, 1, "dp"), (1, 3, 1, "dp"),
                                    (0, 2, 4, "dp"), (1, 3, 4, "dp")):
        problem = large_problem(seed, num_gpus=256, num_types=types, num_layers=32)
        if vpp > 1:  # interleaved copies only (eq. I1's screen), P = 8
            copies = [v for v in interleaved_variants(problem.variants, (vpp,), problem.max_stages, 32)
                      if v.num_stages == 8]
            problem = replace(problem, variants=tuple(copies))
        a = get_solver(start)(problem, SolveOptions(time_limit_s=10)).assignment  # (dp: stages of unequal times)
        limit = evaluate(problem, a) * (1 - 1e-12)
        monkeypatch.setattr(polish_mod, "FAST_SCREEN", True)
        screen = polish_mod._Screen(problem, a, limit)
        assert screen.on
        opts = np.flatnonzero(problem.variants[a.variant].allowed)
        plain = list(polish_mod._layer_moves(a)) + list(polish_mod._option_moves(a, opts))
        screened = list(polish_mod._layer_moves(a, screen)) + list(polish_mod._option_moves(a, opts, screen))
        assert len(plain) == len(screened)
        for c, s_ in zip(plain, screened):
            assert s_ is None or s_ == c
            if s_ is None:
                bound = polish_mod._no_better(problem, c, limit)
                g1 = any("GPUs of" in m for m in violations(problem, c))
                assert bound or g1, (seed, vpp, c)
                by_gpus += not bound
            claimed += s_ is None
            asked += 1
        for budget in (50, 400, 3000):
            runs = []
            for on in (True, False):
                monkeypatch.setattr(polish_mod, "FAST_SCREEN", on)
                run = polish_mod.Polish(problem, a, budget)
                run.step(budget)
                runs.append((run.best, run.tried, run.optimal))
            assert runs[0] == runs[1], (seed, vpp, budget)
    assert asked >= 1000 and claimed >= asked // 4 and by_gpus > 0, (claimed, asked, by_gpus)


# --- MILP backends: HiGHS (highspy) and the CBC fallback (milp.py) ----------------------------------

@pytest.mark.parametrize("seed", [1, 4, 9])
def test_cbc_backend_agrees_with_highs_and_brute_force(seed, monkeypatch):
    problem = random_problem(seed, num_layers=6, max_stages=3, num_variants=2)
    brute = get_solver("brute")(problem, EXACT)
    real = milp._cbc_node

    def no_cbc(*args):
        raise AssertionError("the HiGHS run fell back to CBC")

    monkeypatch.setattr(milp, "_cbc_node", no_cbc)  # the HiGHS result is HiGHS's own
    hi = milp.solve(problem, EXACT)
    monkeypatch.setattr(milp, "_cbc_node", real)
    cbc = milp.solve(problem, EXACT, backend="cbc")
    assert "fallback_nodes" not in hi.stats and "fallback_nodes" not in cbc.stats
    assert hi.status == cbc.status == brute.status, (hi.status, cbc.status, brute.status, cbc.message)
    if brute.status == "OPTIMAL":
        for res in (hi, cbc):
            assert not violations(problem, res.assignment)
            assert res.objective_s == pytest.approx(brute.objective_s, rel=1e-6)
            assert res.bound_s <= brute.objective_s * (1 + 1e-9)


def test_highs_failure_falls_back_to_cbc(monkeypatch):
    problem = random_problem(4, num_layers=6, max_stages=3, num_variants=2)
    brute = get_solver("brute")(problem, EXACT)
    assert brute.status == "OPTIMAL"
    calls = []
    real = milp._cbc_node

    def broken(*args, **kw):
        raise RuntimeError("simulated HiGHS failure")

    monkeypatch.setattr(milp, "_highs_node", broken)
    monkeypatch.setattr(milp, "_cbc_node", lambda *args: calls.append(1) or real(*args))
    monkeypatch.setattr(branch_and_bound, "POOL_SIZE", 1)  # (eq. PAR2's workers' calls are counted in their process)
    res = milp.solve(problem, EXACT)
    assert calls and res.stats["fallback_nodes"] == len(calls)
    assert res.status == "OPTIMAL" and not res.message
    assert res.objective_s == pytest.approx(brute.objective_s, rel=1e-6)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend"):
        milp.solve(random_problem(1), EXACT, backend="glpk")
