"""problem.stage_times / sync_times read each variant's costs as Python floats (``Variant.cost_lists``): the same
doubles as the numpy arrays, so every t_j and s_j, and ``evaluate``, are bit-identical to the array path."""

from __future__ import annotations

import pathlib
import sys
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem

from haap_milp import problem as problem_mod
from haap_milp.problem import Assignment, Stage, evaluate, stage_times, sync_times


def _random_plan(problem, rng) -> Assignment:
    v = int(rng.integers(len(problem.variants)))
    opts = np.flatnonzero(problem.variants[v].allowed)
    p = int(rng.integers(1, problem.max_stages + 1))
    return Assignment(v, tuple(Stage(int(rng.choice(opts)), int(rng.integers(1, 9))) for _ in range(p)))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_the_float_lists_give_the_array_values_bit_for_bit(seed):
    problem = random_problem(seed)
    rng = np.random.default_rng(seed)
    arrays = replace(problem, variants=tuple(replace(v) for v in problem.variants))  # fresh caches
    for v in arrays.variants:  # the array path: cost_lists None, as for an array that is not float64
        v.__dict__["cost_lists"] = None
    for _ in range(20):
        a = _random_plan(problem, rng)
        assert stage_times(problem, a) == stage_times(arrays, a)
        assert sync_times(problem, a) == sync_times(arrays, a)
        assert evaluate(problem, a) == evaluate(arrays, a)
    assert all(v.cost_lists is not None for v in problem.variants)


def test_a_float32_array_keeps_the_array_path():
    problem = random_problem(3)
    v0 = problem.variants[0]
    v32 = replace(v0, layer_time=v0.layer_time.astype(np.float32))
    assert v32.cost_lists is None
    p32 = replace(problem, variants=(v32,) + problem.variants[1:])
    a = Assignment(0, (Stage(int(np.flatnonzero(v0.allowed)[0]), 3),))
    expect = 3 * v32.layer_time[a.stages[0].option] + v32.first_time[a.stages[0].option] \
        + v32.last_time[a.stages[0].option]
    assert problem_mod.stage_times(p32, a) == [float(expect)]
