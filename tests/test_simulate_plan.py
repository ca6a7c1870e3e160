"""The simulator fed by the estimator: same t_j, c_j, s_j as the planner's objective."""

from __future__ import annotations

import pytest
from _emit_cases import A100_16, DENSE, H100_A100, ISLANDS, TIED, hetero_plan, hetero_uniform_plan, uniform_plan

from haap_milp.estimator import Estimator
from haap_milp.pipeline import BWD_SHARE_FULL_RECOMPUTE
from haap_milp.simulate import plan_timings, simulate_plan
from haap_milp.specs import TrainingSpec


def _est(model, cluster, plan):
    return Estimator(model, cluster, TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len,
                                                  precision=plan.precision))


@pytest.mark.parametrize("factory,model,cluster", [(uniform_plan, DENSE, A100_16),
                                                   (hetero_uniform_plan, DENSE, H100_A100),
                                                   (hetero_plan, TIED, ISLANDS)])
def test_simulated_plan_uses_the_estimators_numbers(factory, model, cluster):
    plan = factory()
    est = _est(model, cluster, plan)
    estimate = est.estimate(plan)
    sim = simulate_plan(plan, est)
    assert sim.closed_form_s == pytest.approx(estimate.iteration_time_s, rel=1e-9)  # eq. T1 on the same t, c, s
    t, c, _s, _ = plan_timings(plan, est)
    assert len(c) == plan.pp - 1 and all(x > 0 for x in c)
    compute = [e for e in sim.events if e.kind in "FB" and e.stage == 0]
    assert sum(e.end_s - e.start_s for e in compute) == pytest.approx(plan.num_microbatches * t[0])
    assert sim.peak_inflight == tuple(float(min(plan.pp - j, plan.num_microbatches)) for j in range(plan.pp))
    assert len(sim.stage_labels) == plan.pp


def test_uniform_plan_matches_the_objective_within_one_percent():
    plan = uniform_plan()
    sim = simulate_plan(plan, _est(DENSE, A100_16, plan))
    assert abs(sim.relative_difference) < 0.01


def test_full_recompute_stages_split_three_quarters_backward():
    plan = hetero_plan()
    sim = simulate_plan(plan, _est(TIED, ISLANDS, plan))
    f = next(e for e in sim.events if e.kind == "F" and e.stage == 1)
    b = next(e for e in sim.events if e.kind == "B" and e.stage == 1)
    dur_f, dur_b = f.end_s - f.start_s, b.end_s - b.start_s
    assert dur_b / (dur_f + dur_b) == pytest.approx(BWD_SHARE_FULL_RECOMPUTE)


def test_a_plan_too_long_to_replay_names_its_field():
    """simulate (and solve --plot) on a plan of 1e8 micro-batches: refused at once naming plan.num_microbatches."""
    from haap_milp.errors import HaapInputError

    plan = uniform_plan().model_copy(update={"num_microbatches": 10**8})
    with pytest.raises(HaapInputError, match="plan.num_microbatches = 100000000") as exc:
        simulate_plan(plan, _est(DENSE, A100_16, uniform_plan()))
    assert exc.value.field == "plan.num_microbatches"
