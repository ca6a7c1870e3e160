"""Eq. LS1e (common/polish.py): every stage's option regraded on the same GPUs against a cap on its sync. On a toy
where no single option move improves the plan, the best graded candidate is the best choice of options for those
layers (brute force over every choice); on larger instances every candidate keeps the variant, the layer counts and
each stage's GPUs, and polish with the move stays feasible and never worse than its start."""

from __future__ import annotations

import itertools
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from problem_io import ARRAYS, problem_from_dict
from synthetic import large_problem

from haap_milp.problem import Assignment, Stage, evaluate, violations
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import polish as polish_mod
from haap_milp.specs import SolveOptions


def _toy(layers: list[int], m: int):
    """One group, two options on the same 2 GPUs: A computes faster (1.0 s a layer) but syncs more (2.67 s + 2.69 s
    a layer), B the other way (1.3 s, 1.05 s a layer), as ep 1 and ep 2 of an MoE stage do; no memory limit, no
    links. (Found by a random search for a start no single option move improves.)"""
    arr = {k: [0.0, 0.0] for k in ARRAYS}
    arr.update(layer_time=[1.0, 1.3], sync_per_layer=[2.69, 1.05], sync_fixed=[2.67, 0.0], mem_capacity=[1e12, 1e12])
    return problem_from_dict({
        "num_layers": sum(layers), "max_stages": len(layers), "groups": ["x@main"], "group_capacity": [2 * len(layers)],
        "uniform": False, "same_tp_first_last": False, "options": [[0, 1, 2, 1, "none"], [0, 1, 2, 2, "none"]],
        "variants": [{"samples_per_microbatch": 1, "num_microbatches": m, **arr, "p2p_time": [[0.0]],
                      "allowed": [True, True]}]})


def test_graded_options_reach_the_best_choice_where_one_option_move_cannot():
    layers = [2, 2, 3, 2]
    problem = _toy(layers, 3)
    start = Assignment(0, tuple(Stage(0, n) for n in layers))
    t0 = evaluate(problem, start)
    assert all(evaluate(problem, c) >= t0 for c in polish_mod._option_moves(start, np.array([0, 1])))
    best = min(evaluate(problem, Assignment(0, tuple(Stage(o, n) for o, n in zip(choice, layers))))
               for choice in itertools.product([0, 1], repeat=len(layers)))
    graded = list(polish_mod._grade_moves(problem, start))
    assert graded and best < t0 * 0.99
    assert evaluate(problem, graded[0]) == pytest.approx(best, rel=1e-12)
    assert [s.option for s in graded[0].stages] == [1, 1, 1, 0]  # B early, A last: the syncs rise along the pipeline
    assert evaluate(problem, polish_mod.polish(problem, start)) <= best * (1 + 1e-12)


def test_same_gpus_groups_options_by_their_gpus():
    problem = large_problem(0, num_gpus=256, num_types=2, num_layers=16)
    for o, peers in enumerate(problem.same_gpus):
        assert o in peers and list(peers) == sorted(peers)
        assert {problem.options[x].usage for x in peers} == {problem.options[o].usage}


@pytest.mark.parametrize("seed,types", [(0, 2), (1, 3), (2, 3)])
def test_grade_candidates_keep_variant_layers_and_gpus_and_polish_stays_sound(seed, types):
    problem = large_problem(seed, num_gpus=256, num_types=types, num_layers=32)
    a = get_solver("dp")(problem, SolveOptions(time_limit_s=10)).assignment
    v = problem.variants[a.variant]
    cands = list(polish_mod._grade_moves(problem, a))
    assert cands, "the fixture: a plan whose options have alternatives on the same GPUs"
    assert len({c.stages for c in cands}) == len(cands) and all(c.stages != a.stages for c in cands)
    objs = [evaluate(problem, c) for c in cands]
    assert objs == sorted(objs)
    for c in cands:
        assert c.variant == a.variant and [s.num_layers for s in c.stages] == [s.num_layers for s in a.stages]
        for s, s0 in zip(c.stages, a.stages):
            assert s.option in problem.same_gpus[s0.option] and v.allowed[s.option]
    out = polish_mod.polish(problem, a, 2000)
    assert not violations(problem, out) and evaluate(problem, out) <= evaluate(problem, a)


def test_regrade_gives_the_best_feasible_graded_plan_or_the_plan_itself():
    """Eq. LS2b's step: on the toy the best graded plan; on the DP heuristic's plans a feasible plan no worse than the
    plan given (the plan itself where no graded candidate beats it)."""
    layers = [2, 2, 3, 2]
    problem = _toy(layers, 3)
    start = Assignment(0, tuple(Stage(0, n) for n in layers))
    obj, plan = polish_mod.regrade(problem, start)
    assert [s.option for s in plan.stages] == [1, 1, 1, 0] and obj == pytest.approx(evaluate(problem, plan))
    best = Assignment(0, tuple(Stage(o, n) for o, n in zip([1, 1, 1, 0], layers)))
    assert polish_mod.regrade(problem, best) == (evaluate(problem, best), best)
    for seed, types in [(0, 2), (1, 3)]:
        large = large_problem(seed, num_gpus=256, num_types=types, num_layers=32)
        a = get_solver("dp")(large, SolveOptions(time_limit_s=10)).assignment
        obj, plan = polish_mod.regrade(large, a)
        assert not violations(large, plan) and obj == evaluate(large, plan) <= evaluate(large, a)
