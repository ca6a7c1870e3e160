"""Eq. M4 (haap_milp/memory_cover.py): a variant whose memory cover is below L has no plan, so presolve may drop it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from haap_milp import memory_cover
from haap_milp.problem import Problem
from tests.synthetic import feasible_assignments, random_problem


def _one_variant(problem: Problem, v: int) -> Problem:
    return replace(problem, variants=(problem.variants[v],))


def test_cover_binds_on_some_instances_and_not_on_feasible_ones():
    """Against brute force, on tight-memory instances with a third of the GPUs: the cover never drops a variant
    with a plan (soundness), and it does drop some (the test can fail)."""
    dropped = feasible = 0
    for seed in range(40):
        problem = random_problem(seed)
        problem = replace(problem, group_capacity=tuple(max(1, c // 3) for c in problem.group_capacity))
        for v, var in enumerate(problem.variants):
            if not var.allowed.any():
                continue
            has_plan = next(feasible_assignments(_one_variant(problem, v)), None) is not None
            low = memory_cover.cover(problem.options, problem.group_capacity, var) < problem.num_layers
            dropped += low
            feasible += has_plan
            assert not (low and has_plan)
    assert dropped >= 3 and feasible >= 10, (dropped, feasible)


def test_extras_are_a_floor_of_the_least_loss():
    """The embedding/LM-head loss is the least over options, floored (floor(a - b) <= floor(a) - floor(b))."""
    problem = random_problem(3)
    var = problem.variants[0]
    ok = np.flatnonzero(var.allowed)
    per_layer = var.layer_static_mem[ok] + var.layer_act_mem[ok]
    want = int(np.floor((var.first_static_mem[ok] + var.first_act_mem[ok]) / per_layer).min()
               + np.floor((var.last_static_mem[ok] + var.last_act_mem[ok]) / per_layer).min())
    assert memory_cover.extras_layers(var) == want


def test_presolve_drops_every_variant_and_explains_memory():
    """llama3-405b on 64 GPUs: each option holds a layer, but the cluster cannot hold 126 of them. Presolve now says
    so (before, the search split tau until the time limit and reported no plan)."""
    from haap_milp import planner
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.specs import SolveOptions, TrainingSpec

    model, cluster = load_model("llama3-405b"), load_cluster("h100-80g:32,a100-80g:32")
    training = TrainingSpec(global_batch_size=2048, seq_len=4096)
    out = planner.solve(model, cluster, training, SolveOptions(solver="cpsat", time_limit_s=5, threads=1))
    assert out.result.status == "INFEASIBLE"
    assert "memory binds" in out.result.message and "126 layers" in out.result.message
    assert not out.presolved.problem.variants and out.presolved.memory_short is not None
    assert any("eq. M4" in d for d in out.presolved.dropped)
