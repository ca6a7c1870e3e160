"""The DP heuristic with interleaved copies (eq. DP7, formulations/dp.md): the plain (vpp 1) variants are searched
and their best plan polished before any copy, so a deadline that falls among the copies cannot leave a worse
plan than ``--vpp 1`` would; copies of the plain best's micro-batch come first."""

from __future__ import annotations

import pathlib
import sys
from dataclasses import replace

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem

from haap_milp.interleave import interleaved_variants
from haap_milp.problem import Stage, evaluate, violations
from haap_milp.solvers import dp
from haap_milp.solvers.common import bounds


def _with_copies(seed):
    problem = random_problem(seed, num_layers=int(seed % 3) + 6, max_stages=5, max_options=4)
    extra = interleaved_variants(problem.variants, (2, 3), problem.max_stages, problem.num_layers)
    return problem, replace(problem, variants=problem.variants + tuple(extra))


def test_plain_best_is_polished_before_any_copy_is_searched(monkeypatch):
    events = []
    real_polish, real_tables = dp.polish, dp.build_tables

    def polish(problem, a, *args):
        events.append(("polish", problem.variants[a.variant].vpp))
        return real_polish(problem, a, *args)

    def tables(problem, v):
        events.append(("tables", problem.variants[v].vpp if isinstance(v, int) else None))
        return real_tables(problem, v)

    class Polish(dp.Polish):  # eq. LS3a polishes through resumable runs
        def __init__(self, problem, a, *args):
            events.append(("polish", problem.variants[a.variant].vpp))
            super().__init__(problem, a, *args)

    monkeypatch.setattr(dp, "polish", polish)
    monkeypatch.setattr(dp, "Polish", Polish)
    monkeypatch.setattr(dp, "build_tables", tables)
    monkeypatch.setattr(bounds, "build_tables", tables)  # (the variant loop's tables come through ``root_setup``)
    monkeypatch.setattr(bounds, "_ROOTS", {})
    checked = 0
    for seed in range(8):
        plain, problem = _with_copies(seed)
        if len(problem.variants) == len(plain.variants):
            continue
        events.clear()
        r = dp.solve(problem)
        if r.assignment is None:
            continue
        checked += 1
        first_copy = next(i for i, e in enumerate(events) if e[0] == "tables" and e[1] not in (None, 1))
        assert ("polish", 1) in events[:first_copy]  # the plain best polished before the first copy's tables
        assert violations(problem, r.assignment) == []
        base = dp.solve(plain)  # the copies only add plans: never worse than the plain variants alone
        assert r.objective_s <= base.objective_s * (1 + 1e-9)
    assert checked >= 3


def test_copies_of_the_plain_best_micro_batch_come_first():
    for seed in range(8):
        plain, problem = _with_copies(seed)
        r = dp.solve(plain)
        copies = [w for w in range(len(problem.variants)) if problem.variants[w].vpp != 1]
        if r.assignment is None or not copies:
            continue
        ranked = sorted(copies, key=lambda w: dp._copy_rank(problem, r.assignment, w))
        mb = problem.variants[r.assignment.variant].samples_per_microbatch
        same = [problem.variants[w].samples_per_microbatch == mb for w in ranked]
        assert same == sorted(same, reverse=True)  # all of its micro-batch, then the others


def test_seeds_are_feasible_and_reshape_keeps_the_layers():
    stages = (Stage(0, 3), Stage(1, 1), Stage(1, 2), Stage(0, 4))
    for p in range(1, 9):
        out = dp._reshape(stages, p)
        assert sum(s.num_layers for s in out) == 10 and all(s.num_layers >= 1 for s in out)
        assert len(out) == min(p, 10)
    for seed in range(8):
        plain, problem = _with_copies(seed)
        r = dp.solve(plain)
        copies = [w for w in range(len(problem.variants)) if problem.variants[w].vpp != 1]
        if r.assignment is None:
            continue
        got = dp._seed_copies(problem, r.assignment, copies)
        if got is not None:
            assert violations(problem, got[1]) == [] and got[0] == evaluate(problem, got[1])


def test_polish_top_is_never_worse_than_polishing_the_lowest_plan():
    """Eq. LS2: several variants' DP plans polished, the best kept: never above eq. LS1 on the lowest alone."""
    from haap_milp.solvers.common import build_tables, variant_bound
    from haap_milp.solvers.common.polish import polish

    for seed in range(6):
        problem = random_problem(seed, num_layers=8, max_stages=4, max_options=4)
        found = {}
        for v in range(len(problem.variants)):
            t = build_tables(problem, v)
            vb = variant_bound(problem, t)
            for r in dp._restrictions(problem, t):
                got, _ = dp._variant(problem, t, r, vb.rest_lb)
                if got is not None and (v not in found or got[0] < found[v][0]):
                    found[v] = got
        if not found:
            continue
        lowest = min(found.values(), key=lambda b: b[0])[1]
        top = dp._polish_top(problem, found)
        assert violations(problem, top[1]) == [] and top[0] == evaluate(problem, top[1])
        assert top[0] <= evaluate(problem, polish(problem, lowest)) * (1 + 1e-12)


def _found(problem):
    from haap_milp.solvers.common import build_tables, variant_bound

    found = {}
    for v in range(len(problem.variants)):
        t = build_tables(problem, v)
        vb = variant_bound(problem, t)
        for r in dp._restrictions(problem, t):
            got, _ = dp._variant(problem, t, r, vb.rest_lb)
            if got is not None and (v not in found or got[0] < found[v][0]):
                found[v] = got
    return found


def test_polish_top_in_turn_is_ls1_on_each_without_a_deadline(monkeypatch):
    """Eq. LS3a: polishing the plans in turn, in chunks, ends where LS1 on each alone ends (no deadline): the chunked
    run resumes its move order (a restart per chunk would re-scan and, with small chunks, never finish)."""
    from haap_milp.solvers.common.polish import polish

    checked = 0
    for seed in range(6):
        problem = random_problem(seed, num_layers=8, max_stages=4, max_options=4)
        found = _found(problem)
        if not found:
            continue
        plans = sorted(found.values(), key=lambda b: b[0])[:dp.POLISH_TOP]
        want = min(evaluate(problem, polish(problem, a)) for _, a in plans)
        for chunk in (1, 7, 10**6):
            monkeypatch.setattr(dp, "POLISH_CHUNK", chunk)
            top = dp._polish_top(problem, found)
            assert top[0] == want and violations(problem, top[1]) == []
        checked += 1
    assert checked >= 3


def test_polish_runs_resume_where_they_stopped():
    """``Polish.step`` in pieces gives the plan and the move count of one ``polish`` call with the summed budget."""
    from haap_milp.solvers.common.polish import Polish, polish

    for seed in range(6):
        problem = random_problem(seed, num_layers=8, max_stages=4, max_options=4)
        for _, a in _found(problem).values():
            for budget in (5, 40, 10**4):
                run = Polish(problem, a)
                while not run.done and run.tried < budget:
                    run.step(min(3, budget - run.tried))
                assert run.best == polish(problem, a, budget)


def test_polish_returns_an_infeasible_plan_unevaluated():
    """LS1 on a plan that breaks a constraint returns it as it is, no move tried."""
    from haap_milp.problem import Assignment
    from haap_milp.solvers.common.polish import Polish, polish

    problem = random_problem(0, num_layers=8, max_stages=4, max_options=4)
    bad = Assignment(0, (Stage(int(problem.variants[0].allowed.argmax()), 1),))  # 1 layer of 8
    assert violations(problem, bad)
    assert polish(problem, bad) is bad
    run = Polish(problem, bad)
    run.step(10)
    assert run.done and run.best is bad and run.tried == 0


def test_the_plain_search_stops_past_the_best_micro_batch():
    """Eq. DP8g: with one plain variant per micro-batch, ascending, the DP stops at a variant whose plan is slower
    than the one before it and more than STOP_RISE above the best; not while plans still fall, not within
    STOP_RISE of the best, and never when the micro-batches do not ascend."""
    from types import SimpleNamespace

    from haap_milp.solvers import dp

    def problem(batches):
        return SimpleNamespace(variants=[SimpleNamespace(samples_per_microbatch=b) for b in batches])

    p = problem([1, 2, 4, 8])
    best = (10.0, None)
    assert dp._past_the_best(p, [0, 1, 2, 3], {0: (12.0,), 1: (10.0,), 2: (11.5,)}, 2, best)
    assert not dp._past_the_best(p, [0, 1, 2, 3], {0: (12.0,), 1: (10.0,), 2: (10.5,)}, 2, best)  # within 10 %
    assert not dp._past_the_best(p, [0, 1, 2, 3], {0: (14.0,), 1: (12.0,)}, 1, best)  # still falling
    assert not dp._past_the_best(p, [0, 1, 2, 3], {0: (10.0,)}, 0, best)  # the first variant
    assert not dp._past_the_best(problem([1, 2, 2, 4]), [0, 1, 2, 3], {0: (10.0,), 1: (12.0,)}, 1, best)
