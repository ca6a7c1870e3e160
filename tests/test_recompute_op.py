"""Recompute mode "op" (torchtitan's op-level selective activation checkpointing) through the emitters and the CLI."""

from __future__ import annotations

import tomllib

from _emit_cases import DENSE, LLAMA8B, llama_hetero_plan, uniform_plan

from haap_milp.emit import flagscale, megatron
from haap_milp.emit.torchtitan import build_python, build_toml


def _with(plan, recompute):
    return plan.model_copy(update={"stages": tuple(s.model_copy(update={"recompute": recompute})
                                                   for s in plan.stages)})


def test_torchtitan_emits_op_as_its_selective_ac():
    plan = _with(llama_hetero_plan(), "op")
    assert "SelectiveAC.Config()" in build_python(plan, LLAMA8B)
    doc = tomllib.loads(build_toml(plan, LLAMA8B))
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_megatron_and_flagscale_refuse_op():
    plan = _with(uniform_plan(), "op")
    assert any(v.rule == "megatron.recompute" for v in megatron.refusals(plan, DENSE))
    assert any(v.rule == "flagscale.recompute" for v in flagscale.refusals(plan, DENSE))


def test_recompute_op_sits_between_selective_and_full(run_cli):
    """A plan with recompute "op": less memory than selective (with flash attention selective keeps every
    activation), more than full; more time than selective, less than full."""
    from estimator_helpers import LLAMA_8B, cluster, training, uniform_plan

    from haap_milp.estimator import Estimator

    est = Estimator(LLAMA_8B, cluster(nodes=1), training(16, 8192))
    out = {}
    for rc in ("selective", "op", "full"):
        pe = est.estimate(uniform_plan(LLAMA_8B, "h100-80g", 1, 1, 8, 2, 16, 8192, recompute=rc))
        out[rc] = (pe.iteration_time_s, pe.stages[0].memory_gib)
    assert out["full"][1] < out["op"][1] < out["selective"][1]
    assert out["selective"][0] < out["op"][0] < out["full"][0]
    code, _, err = run_cli(["estimate", "--model", "llama3-8b", "--cluster", "h100-80g:8", "--recompute", "bogus"])
    assert code == 2 and "none, selective, full or op" in err


def test_search_sets_per_target():
    """torchtitan searches op where the runtime allows selective (its SelectiveAC is op-level); Megatron never
    searches op; any target searches op only when the runtime's --recompute names it."""
    from haap_milp.catalog.loaders import load_cluster, load_model
    from haap_milp.presolve import build
    from haap_milp.specs import SolveOptions, TrainingSpec

    def modes(target, allowed=("none", "selective", "full")):
        tr = TrainingSpec(global_batch_size=64, seq_len=4096, recompute_modes=allowed)
        prob = build(load_model("llama3-8b"), load_cluster("h100-80g:16"), tr, SolveOptions(target=target)).problem
        return {o.recompute for o in prob.options}

    assert modes("torchtitan") == {"none", "op", "full"}
    assert modes("megatron") == {"none", "selective", "full"}
    assert modes("any") == {"none", "selective", "full"}
    assert modes("any", ("none", "op")) == {"none", "op"}
    assert modes("megatron", ("none", "selective", "full", "op")) == {"none", "selective", "full"}


def test_solve_refuses_a_recompute_set_the_target_cannot_run(run_cli):
    """--recompute op with --target megatron: exit 2 naming the flag as typed and the target, before any search
    (it used to solve with op and end in the checker's megatron.recompute violation, exit 1)."""
    code, _, err = run_cli(["solve", "-m", "llama3-8b", "-c", "h100-80g:8", "--recompute", "op", "--target",
                            "megatron", "--time-limit", "5"])
    assert code == 2 and "--recompute op" in err and "megatron" in err and "Traceback" not in err
