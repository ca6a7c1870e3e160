"""Interleaved 1F1B as a search dimension (formulations/README.md, eqs. I1-I5): closed form vs the event
replay, exact solvers vs brute force on interleaved variants, presolve's candidates and the engines' rules."""

from __future__ import annotations

import pathlib
import random
import sys
from dataclasses import replace

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import assert_exact_solvers_match_brute, random_problem

from haap_milp import pipeline
from haap_milp.errors import HaapInputError
from haap_milp.interleave import chunk_layers, interleaved_variants, stage_counts, vpp_candidates
from haap_milp.problem import violations
from haap_milp.simulate import simulate
from haap_milp.solvers import get_solver
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=2, seed=0)


def test_uniform_stages_without_links_have_the_sc21_bubble():
    """Eq. I1 on P equal stages and no links: (M + (P-1)/vpp) t, and the replay agrees exactly."""
    for p, v, m in ((4, 2, 8), (4, 4, 8), (8, 2, 16), (3, 3, 6)):
        t = [1.0] * p
        closed = pipeline.iteration_time(t, [0.0] * (p - 1), [0.0] * p, m, "interleaved", v, 0.0)
        assert closed == pytest.approx(m + (p - 1) / v, rel=1e-12)
        sim = simulate([1 / 3] * p, [2 / 3] * p, [0.0] * (p - 1), None, num_microbatches=m, schedule="interleaved",
                       vpp=v, wrap_p2p_s=0.0)
        assert sim.iteration_time_s == pytest.approx(closed, rel=1e-9)


def test_closed_form_tracks_the_replay_on_random_pipelines():
    """Eqs. I1-I3 against the event replay of Megatron-Core 0.16's order (benchmarks/sim_vs_closed_form.py has
    the full grid): uneven stages, links up to half a stage, M a multiple of P."""
    rng = random.Random(3)
    worst = 0.0
    for _ in range(40):
        p, v = rng.choice((3, 4, 6)), rng.choice((2, 3, 4))
        m = p * rng.choice((1, 2, 4))
        t = [rng.uniform(0.6, 1.4) for _ in range(p)]
        c = [rng.uniform(0.0, 0.3) for _ in range(p - 1)]
        s = [rng.uniform(0.0, 0.4) for _ in range(p)]
        w = rng.uniform(0.0, 0.3)
        closed = pipeline.iteration_time(t, c, s, m, "interleaved", v, w)
        sim = simulate([x / 3 for x in t], [2 * x / 3 for x in t], c, s, num_microbatches=m, schedule="interleaved",
                       vpp=v, wrap_p2p_s=w).iteration_time_s
        worst = max(worst, abs(sim - closed) / closed)
    assert worst < 0.2


def test_inflight_chunks_follow_megatron():
    # rank 0 of P = 4, vpp = 2: warm-up (4-0-1)*2 + (2-1)*4 = 10, plus the chunk being computed
    assert pipeline.interleaved_inflight_chunks(0, 4, 100, 2) == 11
    assert pipeline.interleaved_inflight_chunks(3, 4, 100, 2) == 5
    assert pipeline.interleaved_inflight_chunks(0, 4, 4, 2) == 8  # capped at M * vpp
    assert pipeline.interleaved_tau_weight(8, 1) == 7 and pipeline.interleaved_tau_weight(8, 4) == 7.75


def test_eq_i5_and_candidates():
    assert stage_counts(24, 32, 80) == [3, 4, 6, 8, 12, 24]
    assert stage_counts(8, 4, 80) == [4]
    assert stage_counts(24, 32, 12, vpp=4) == [3, 4, 6, 8]  # L - P + 1 >= vpp: a deep stage can fill every round
    assert stage_counts(24, 32, 12, vpp=11) == [] and stage_counts(24, 32, 12, vpp=10) == [3]
    assert vpp_candidates(1, True) == () and vpp_candidates("auto", True) == (2, 3, 4)
    assert vpp_candidates("auto", False) == () and vpp_candidates(3, True) == (3,)
    with pytest.raises(HaapInputError, match="--vpp 2"):
        vpp_candidates(2, False, "target flagscale has no interleaved schedule")
    assert chunk_layers(10, 4) == [3, 3, 2, 2] and sum(chunk_layers(7, 3)) == 7


@pytest.mark.parametrize("seed", [0, 2, 6, 9, 10, 13])
def test_exact_solvers_match_brute_force_on_interleaved_variants(seed):
    """CP-SAT and MILP on problems whose variants are plain and interleaved (vpp 2, 3; every P of eq. I5)."""
    problem = random_problem(seed, num_layers=int(seed % 3) + 5, max_stages=5, max_options=4)
    extra = interleaved_variants(problem.variants, (2, 3), problem.max_stages, problem.num_layers)
    problem = replace(problem, variants=problem.variants + tuple(extra))
    assert_exact_solvers_match_brute(problem, EXACT, rel=1e-9, check_bound=True)


def test_interleaved_variant_rules_in_violations():
    problem = random_problem(4, num_layers=6, max_stages=5, max_options=4)
    var = replace(problem.variants[0], vpp=2, num_stages=3)
    problem = replace(problem, variants=(var,))
    res = get_solver("brute")(problem, EXACT)
    if res.assignment is not None:
        assert len(res.assignment.stages) == 3
        short = replace(res.assignment, stages=res.assignment.stages[:2])
        assert any("vpp 2" in x for x in violations(problem, short))


def _interleaved_plan(layers, vpp, gbs=32):
    from haap_milp.catalog.data import model_entry
    from haap_milp.specs import Plan, StagePlan

    model = model_entry("llama3-8b").spec
    stages, pos = [], 0
    for n in layers:
        stages.append(StagePlan(first_layer=pos, num_layers=n, gpu_type="h100-80g", island="main", tp=2, dp=2,
                                recompute="none"))
        pos += n
    plan = Plan(model=model.name, stages=tuple(stages), micro_batch_size=1, num_microbatches=gbs // 2,
                global_batch_size=gbs, seq_len=4096, schedule="interleaved", vpp=vpp)
    return plan, model


def test_megatron_emits_the_uneven_virtual_layout():
    """A heterogeneous split with vpp 3: --pipeline-model-parallel-layout with P*vpp virtual stages, each stage's
    layers split as interleave.chunk_layers says, accepted by the Megatron rules (M % P == 0, pp > 2) and, where
    megatron-core is installed, by its TransformerConfig."""
    from haap_milp.emit.megatron import build_args, plan_violations
    from haap_milp.emit.megatron_rules import parse_argv, parse_layout
    from haap_milp.planfile import virtual_layout

    plan, model = _interleaved_plan([7, 9, 9, 7], 3)
    assert plan_violations(plan, model) == []
    argv = build_args(plan, model)
    a = parse_argv(argv)
    virt = parse_layout(str(a["pipeline_model_parallel_layout"]))
    assert len(virt) == 4 * 3
    for k, chunk in enumerate(virt):  # virtual stage k = chunk k // P of stage k % P
        assert chunk.count("t") == chunk_layers([7, 9, 9, 7][k % 4], 3)[k // 4]
    lay = virtual_layout(plan)
    assert lay["layers_per_chunk"] == [chunk_layers(n, 3) for n in (7, 9, 9, 7)]
    assert lay["virtual_stages"][-1]["layers"][1] == 32
    bad, _ = _interleaved_plan([7, 9, 9, 7], 3, gbs=36)  # 18 micro-batches: not a multiple of P = 4 (eq. I5)
    assert any(v.rule == "megatron.vpp_microbatches" for v in plan_violations(bad, model))
    import importlib.util

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig
    from test_emit_engine_validators import transformer_config_kwargs

    cfg = TransformerConfig(**transformer_config_kwargs(argv, torch, F, TransformerConfig))
    assert cfg.virtual_pipeline_model_parallel_size == 3
    assert cfg.pipeline_model_parallel_layout.virtual_pipeline_model_parallel_size == 3


def test_cli_vpp_flag():
    """--vpp: a bad value is one paragraph and exit 2; an explicit N where the target cannot interleave too."""
    from conftest import invoke_cli

    code, _, err = invoke_cli(["solve", "--vpp", "two"])
    assert code == 2 and "--vpp" in err and "Traceback" not in err and err.count("\n") <= 1
    code, _, err = invoke_cli(["solve", "--vpp", "2", "--target", "flagscale", "--time-limit", "5"])
    assert code == 2 and "--vpp 2" in err and "interleaved" in err
