"""The independent checker: valid plans pass; one hand-made bad plan per rule, found with its numbers."""

from __future__ import annotations

import pytest
from _emit_cases import (
    A100_16,
    DENSE,
    H100_A100,
    ISLANDS,
    MOE,
    TIED,
    hetero_plan,
    hetero_uniform_plan,
    interleaved_plan,
    moe_plan,
    uniform_plan,
)

from haap_milp.check import Violation, check_plan
from haap_milp.specs import ModelSpec, StagePlan, TrainingSpec


def _with_stage(plan, j, **upd):
    stages = list(plan.stages)
    stages[j] = stages[j].model_copy(update=upd)
    return plan.model_copy(update={"stages": tuple(stages)})


def rules(plan, model=DENSE, cluster=H100_A100, **kw) -> dict[str, Violation]:
    found = check_plan(plan, model, cluster, **kw)
    return {v.rule: v for v in found}


@pytest.mark.parametrize("factory,model,cluster", [
    (uniform_plan, DENSE, A100_16), (hetero_uniform_plan, DENSE, H100_A100), (interleaved_plan, DENSE, H100_A100),
    (hetero_plan, TIED, ISLANDS), (moe_plan, MOE, A100_16)])
def test_valid_plans_pass(factory, model, cluster):
    assert check_plan(factory(), model, cluster) == []


def test_layers_order_gap_and_overlap():
    p = hetero_uniform_plan()
    gap = _with_stage(p, 1, first_layer=6, num_layers=2)
    v = rules(gap, memory=False)
    assert "layers.order" in v and "gap" in v["layers.order"].message and v["layers.order"].stage == 1
    over = _with_stage(p, 1, first_layer=4, num_layers=4)
    v = rules(over, memory=False)
    assert "overlap" in v["layers.order"].message and "layers.coverage" in v  # 5 + 4 = 9 layers of 8


def test_layers_empty_stage_and_coverage():
    p = hetero_uniform_plan()
    v = rules(_with_stage(p, 1, num_layers=0), memory=False)
    assert "layers.empty_stage" in v and "layers.coverage" in v
    assert "hold 5 layers" in v["layers.coverage"].message and "has 8" in v["layers.coverage"].message


def test_gpus_unknown_type_and_island():
    p = hetero_uniform_plan()
    assert "gpus.unknown_type" in rules(_with_stage(p, 1, gpu_type="mi300x-192g"), memory=False)
    assert "gpus.island" in rules(_with_stage(p, 1, island="far"), memory=False)


def test_gpus_per_type_exceeded():
    p = hetero_uniform_plan()
    v = rules(_with_stage(p, 1, dp=8), memory=False)  # 16 A100 GPUs wanted, 8 exist
    assert "16 a100-80g GPUs used, cluster has 8" in v["gpus.per_type"].message


def test_gpus_per_island_exceeded():
    p = hetero_plan()  # v100s: 16 on roce-v100 and 8 on eth-v100
    bad = _with_stage(_with_stage(p, 3, island="roce-v100"), 2, tp=4, dp=2)
    v = rules(bad, TIED, ISLANDS, memory=False)
    assert "gpus.per_island" in v and "24 v100-32g GPUs used on island 'roce-v100', it has 16" in \
        v["gpus.per_island"].message


def test_tp_heads_kv_heads_and_node():
    p = hetero_uniform_plan()
    model = DENSE.model_copy(update={"num_heads": 12, "num_kv_heads": 6, "hidden": 768})
    v = rules(_with_stage(p, 0, tp=8, dp=1), model=ModelSpec.model_validate(model.model_dump()), memory=False)
    assert "tp.heads" in v and "tp.kv_heads" in v
    v = rules(_with_stage(p, 0, tp=16, dp=1), memory=False)
    assert "tp.node" in v and "does not fit a node of 8" in v["tp.node"].message


def test_batch_dp_divides_and_global():
    p = hetero_uniform_plan()  # 2 x 4 = 8 samples per micro-batch
    v = rules(_with_stage(p, 1, dp=3, tp=2), memory=False)
    assert "batch.dp_divides" in v and v["batch.dp_divides"].stage == 1
    v = rules(p.model_copy(update={"num_microbatches": 7}), memory=False)
    assert "8 samples per micro-batch x 7 micro-batches = 56, global batch is 64" in v["batch.global"].message


def test_ep_rules():
    assert "ep.dense" in rules(_with_stage(hetero_uniform_plan(), 0, ep=2), memory=False)
    m = moe_plan()
    assert "ep.experts" in rules(_with_stage(m, 0, ep=3, dp=6, tp=1), MOE, A100_16, memory=False)
    assert "ep.fold" in rules(_with_stage(m, 0, ep=8, etp=2), MOE, A100_16, memory=False)


def test_cp_seq_and_schedule_vpp_and_precision():
    p = hetero_uniform_plan()
    assert "cp.seq" in rules(p.model_copy(update={"cp": 3, "seq_len": 2048}), memory=False)
    assert "schedule.vpp" in rules(p.model_copy(update={"vpp": 2}), memory=False)
    bf16_on_v100 = hetero_plan().model_copy(update={"precision": "bf16"})
    v = rules(bf16_on_v100, TIED, ISLANDS, memory=False)
    assert "precision.gpu" in v and "v100-32g does not support bf16" in v["precision.gpu"].message


def test_vpp_beyond_what_the_layers_fill():
    """vpp > L - pp + 1 (a virtual round empty on every stage whatever the split) is refused naming plan.vpp; fewer
    layers than vpp on some stages (Megatron's uneven layout: the fixture's 1-layer stages at vpp 2) passes."""
    p = interleaved_plan()  # 8 layers over 4 stages: the deepest holds at most 5
    v = rules(p.model_copy(update={"vpp": 6}), memory=False)
    assert "schedule.vpp_layers" in v and "plan.vpp = 6" in v["schedule.vpp_layers"].message
    assert "use vpp <= 5" in v["schedule.vpp_layers"].message
    assert "schedule.vpp_layers" not in rules(p.model_copy(update={"vpp": 5}), memory=False)
    assert "schedule.vpp_layers" not in rules(p, memory=False)
    assert "schedule.vpp_layers" in rules(p.model_copy(update={"vpp": 10**9}), memory=False)


def test_memory_capacity_from_the_estimator():
    big = ModelSpec(name="big", num_layers=8, hidden=8192, ffn_hidden=28672, num_heads=64, num_kv_heads=8,
                    vocab_size=128256)
    st = tuple(StagePlan(first_layer=4 * j, num_layers=4, gpu_type="a100-80g", tp=1, dp=1) for j in range(2))
    plan = uniform_plan().model_copy(update={"stages": st, "model": "big", "micro_batch_size": 1,
                                             "global_batch_size": 64, "num_microbatches": 64})
    v = rules(plan, big, A100_16, training=TrainingSpec(global_batch_size=64, seq_len=2048))
    assert "memory.capacity" in v
    msg = v["memory.capacity"].message
    assert "GiB per a100-80g GPU" in msg and "76.00 GiB usable" in msg


def test_target_rules_are_the_emitters():
    v = rules(hetero_plan(), TIED, ISLANDS, target="megatron", memory=False)
    assert "megatron.uniform" in v
    v = rules(interleaved_plan(), target="flagscale", memory=False)
    assert "flagscale.no_vpp" in v
    assert rules(hetero_plan(), TIED, ISLANDS, target="flagscale") == {}
    v = rules(hetero_uniform_plan().model_copy(update={"global_batch_size": 60, "num_microbatches": 8}),
              target="megatron", memory=False)
    assert "megatron.global_batch" in v and "batch.global" in v


@pytest.mark.parametrize("target", ["megatron", "flagscale", "torchtitan"])
@pytest.mark.parametrize("edit", ["layers", "vpp"])
def test_engine_rules_wait_for_a_whole_layer_split(target, edit):
    """A hand-edited plan with 1e9 layers in a stage or vpp = 1e9 gets its layers.* / schedule.vpp_layers
    refusal at once: the engine's rules (which lay out every layer and chunk) run only on a whole split."""
    import signal

    p = hetero_uniform_plan()
    bad = _with_stage(p, 0, num_layers=10**9) if edit == "layers" else \
        p.model_copy(update={"vpp": 10**9, "schedule": "interleaved"})

    def too_slow(*_a):
        raise TimeoutError("the checker is laying out 1e9 layers")

    old = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(10)
    try:
        v = rules(bad, target=target, memory=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert ("layers.coverage" if edit == "layers" else "schedule.vpp_layers") in v
    assert not any(r.startswith(target) for r in v), v


def test_violation_str_names_rule_and_stage():
    assert str(Violation("tp.heads", 2, "x")) == "[tp.heads] stage 2: x"
    assert str(Violation("batch.global", None, "y")) == "[batch.global] plan: y"


@pytest.mark.parametrize("target", ["any", "megatron", "flagscale"])
def test_checker_accepts_the_dp_planners_plan(target):
    from haap_milp import planner
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.specs import SolveOptions

    model, cluster = load_model("llama3-8b"), load_cluster("h100-a100-32")
    training = TrainingSpec(global_batch_size=128, seq_len=2048)
    out = planner.solve(model, cluster, training, SolveOptions(solver="dp", target=target))
    assert out.result.plan is not None
    assert check_plan(out.result.plan, model, cluster, training, target=target) == []
