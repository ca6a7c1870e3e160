"""Eq. LS1d (common/polish.py): the stages reordered. sigma of eqs. T3/I1 is least with the middle stages by ascending
DP sync (checked against every order by brute force), the move keeps the stages and their ends, and polish with it
is never worse than without it from the same plan."""

from __future__ import annotations

import itertools
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import large_problem

from haap_milp.pipeline import exposed_sync
from haap_milp.problem import evaluate, sync_times, violations
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import polish as polish_mod
from haap_milp.specs import SolveOptions

SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow]}


@settings(max_examples=200, **SETTINGS)
@given(p=st.integers(3, 7), share=st.sampled_from([0.0, 0.25, 0.5, 1.0]), seed=st.integers(0, 2**31 - 1))
def test_ascending_sync_in_the_middle_is_the_least_sigma_of_every_order(p, share, seed):
    """Brute force over every order of the middle stages (each stage keeps its own time and sync, the ends fixed):
    none has a smaller sigma than the middle by ascending sync; the descending order is never smaller either way."""
    rng = np.random.default_rng(seed)
    t, s = rng.uniform(0.001, 0.05, p).tolist(), rng.uniform(0.0, 0.2, p).tolist()
    mid = sorted(range(1, p - 1), key=lambda j: s[j])

    def sigma(order):
        idx = [0, *order, p - 1]
        return exposed_sync([t[j] for j in idx], [s[j] for j in idx], share)

    best = min(sigma(list(o)) for o in itertools.permutations(range(1, p - 1)))
    assert sigma(mid) <= best * (1 + 1e-12) + 1e-15
    assert sigma(mid) <= sigma(mid[::-1]) * (1 + 1e-12) + 1e-15


@pytest.mark.parametrize("seed,types", [(0, 2), (1, 3), (2, 3)])
def test_order_moves_keep_the_stages_and_sort_the_middle(seed, types):
    problem = large_problem(seed, num_gpus=256, num_types=types, num_layers=32)
    a = get_solver("dp")(problem, SolveOptions(time_limit_s=10)).assignment
    assert len(set(a.stages[1:-1])) > 1, "the fixture: a plan whose middle stages differ"
    # the plan's stages reversed in the middle: the sort must put them back by sync
    rev = type(a)(a.variant, (a.stages[0],) + a.stages[1:-1][::-1] + (a.stages[-1],))
    moves = list(polish_mod._order_moves(problem, rev))
    assert moves
    for m in moves:
        assert sorted(m.stages, key=repr) == sorted(rev.stages, key=repr) and m.variant == rev.variant
    s = sync_times(problem, rev)
    mid = sorted(range(1, len(rev.stages) - 1), key=lambda j: s[j])
    swaps = moves
    if mid != list(range(1, len(rev.stages) - 1)):  # not yet in order: the first candidate is the sorted middle
        first, swaps = moves[0], moves[1:]
        assert first.stages == (rev.stages[0], *(rev.stages[j] for j in mid), rev.stages[-1])
        s1 = sync_times(problem, first)
        assert s1[1:-1] == sorted(s1[1:-1])
    assert len(swaps) == sum(x != y for x, y in zip(rev.stages, rev.stages[1:]))
    assert all(sum(x != y for x, y in zip(m.stages, rev.stages)) == 2 for m in swaps)


@pytest.mark.parametrize("seed,types", [(0, 2), (1, 3), (3, 3)])
def test_polish_with_order_moves_is_feasible_and_never_worse(seed, types, monkeypatch):
    """From the DP heuristic's plan and from that plan's middle reversed: with eq. LS1d the polished plan is
    feasible and no worse than the start; from the reversed start it is no worse than the same polish without the
    move (which has no way to undo the reversal but layer and option moves)."""
    problem = large_problem(seed, num_gpus=256, num_types=types, num_layers=32)
    a = get_solver("dp")(problem, SolveOptions(time_limit_s=10)).assignment
    rev = type(a)(a.variant, (a.stages[0],) + a.stages[1:-1][::-1] + (a.stages[-1],))
    for start in (a, rev):
        if violations(problem, start):
            continue
        with_order = polish_mod.polish(problem, start, 800)
        assert not violations(problem, with_order) and evaluate(problem, with_order) <= evaluate(problem, start)
        if start is rev:
            monkeypatch.setattr(polish_mod, "USE_ORDER_MOVES", False)
            without = polish_mod.polish(problem, start, 800)
            monkeypatch.setattr(polish_mod, "USE_ORDER_MOVES", True)
            assert evaluate(problem, with_order) <= evaluate(problem, without) * (1 + 1e-12)
