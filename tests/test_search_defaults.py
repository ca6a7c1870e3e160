"""Issue #15 defaults (formulations/ eqs. D1-D3): "default" (what a plain CLI solve passes) searches cp from 32k tokens, interleaving
where 1F1B's fill/drain share is material and the ZeRO stage under the fsdp runtime, and builds exactly the
Problem of the explicit old values (cp 1, vpp 1, the runtime's ZeRO) elsewhere. Presolve only (fast)."""

from __future__ import annotations

import pickle

import pytest

from haap_milp.catalog.loaders import load_cluster, load_model
from haap_milp.cp_etp import default_cp
from haap_milp.interleave import MATERIAL_FILL, default_vpp, fill_share, occupying_microbatches
from haap_milp.presolve import build
from haap_milp.specs import SolveOptions, TrainingSpec
from haap_milp.zero import default_zero

OLD = {"vpp": 1, "cp": 1, "zero": None}  # the explicit values that were the defaults before eqs. D1-D3
NEW = {"vpp": "default", "cp": "default", "zero": "default"}  # what the CLI passes when no flag is given


def _problem(model, cluster, gbs, seq=4096, engine="megatron", zero_stage=None, **opts):
    opts = {**NEW, **opts}
    training = TrainingSpec(global_batch_size=gbs, seq_len=seq, engine=engine, zero_stage=zero_stage)
    return build(load_model(model), load_cluster(cluster), training, SolveOptions(**opts)).problem


def test_default_grid_instance_builds_the_old_problem():
    """Seq 4096, gbs 512: none of D1-D3 fires, so the Problem is byte-for-byte the old default's."""
    new = _problem("gpt3-1.3b", "h100-80g:16", 512)
    old = _problem("gpt3-1.3b", "h100-80g:16", 512, **OLD)
    assert pickle.dumps(new) == pickle.dumps(old)
    assert all(v.vpp == 1 for v in new.variants) and all(o.cp == 1 and o.zero is None for o in new.options)


def test_d1_cp_searched_from_32k_tokens():
    assert default_cp("default", 32768) == "auto" and default_cp("default", 16384) == 1
    assert default_cp(2, 131072) == 2 and default_cp("auto", 4096) == "auto"  # explicit values unchanged
    long = _problem("llama3-8b", "h100-80g:16", 16, seq=131072)
    assert any(o.cp > 1 for o in long.options)
    assert all(o.cp == 1 for o in _problem("llama3-8b", "h100-80g:16", 16, seq=131072, cp=1).options)
    # an engine without cp (FlagScale) gets cp 1 by default, not an error
    assert all(o.cp == 1 for o in _problem("llama3-8b", "h100-80g:16", 16, seq=131072, target="flagscale").options)


def test_d2_fill_share_and_rule():
    assert fill_share(16, 16) == pytest.approx(15 / 31)  # (P - 1) / (M + P - 1)
    assert fill_share(512, 32) < MATERIAL_FILL <= fill_share(64, 16)
    assert default_vpp("default", [512, 256, 1], 32, 32) == 1  # M* = 512 on 32 stages: 5.7 %
    assert default_vpp("default", [16, 8, 4, 2, 1], 32, 80) == "auto"  # M* = 16, P = 16: 48 %
    assert default_vpp("default", [2, 1], 32, 80) == 1  # no P >= 3 divides M*: the engine cannot interleave
    assert default_vpp(1, [16], 32, 80) == 1 and default_vpp(3, [512], 32, 32) == 3



def test_d2_judges_the_bubble_at_variants_that_can_occupy_the_cluster():
    """Eq. D2's M*: only variants whose widest pipeline (max_stages x their largest option) holds every GPU count; a
    1-sample micro-batch (dp 1, M = gbs) on 512 GPUs is not a plan anyone runs. gpt3-1.3b (24 layers, tp <= 8) on
    512 H100 at gbs 512: B = 1 reaches 24 x 8 = 192 GPUs, B = 4 reaches 512, so M* = 128, P* = 16 and f = 10.5 %:
    interleaving is searched (with M* = 512 it was not: f = 2.8 %)."""
    from types import SimpleNamespace as NS

    import numpy as np

    opts = [NS(num_gpus=8), NS(num_gpus=32)]
    var = [NS(num_microbatches=512, allowed=np.array([True, False])),
           NS(num_microbatches=128, allowed=np.array([True, True]))]
    assert occupying_microbatches(var, opts, 24, 512) == [128]
    assert occupying_microbatches(var[:1], opts, 24, 512) == [512]  # none occupies: the widest
    p = _problem("gpt3-1.3b", "h100-80g:512", 512)
    assert any(v.vpp > 1 for v in p.variants)
    assert default_vpp("default", [512], 24, 24) == 1 and default_vpp("default", [128], 24, 24) == "auto"

def test_d2_small_batch_deep_pipeline_interleaves_only_where_the_share_is_material():
    p = _problem("llama3-70b", "a100-40g:64", 16)
    inter = [v for v in p.variants if v.vpp > 1]
    assert inter and all(fill_share(v.num_microbatches, v.num_stages) >= MATERIAL_FILL for v in inter)
    assert not [v for v in _problem("llama3-70b", "a100-40g:64", 16, vpp=1).variants if v.vpp > 1]
    # a target without an interleaved schedule: vpp 1 by default, not an error
    assert not [v for v in _problem("llama3-70b", "a100-40g:64", 16, target="flagscale").variants if v.vpp > 1]


def test_d3_zero_searched_under_fsdp_only():
    training = TrainingSpec(global_batch_size=64, seq_len=4096, engine="fsdp")
    assert default_zero("default", training) == "auto"
    assert default_zero("default", training.model_copy(update={"zero_stage": 3})) is None  # a fixed stage wins
    assert default_zero("default", TrainingSpec(global_batch_size=64, seq_len=4096)) is None  # megatron
    assert default_zero((1,), training) == (1,)
    fsdp = _problem("llama2-13b", "a100-40g:16", 64, engine="fsdp", target="torchtitan", max_stages=1)
    assert len({o.zero for o in fsdp.options}) > 1
    assert {o.zero for o in _problem("llama2-13b", "a100-40g:16", 64, engine="fsdp", zero_stage=3,
                                     target="torchtitan", max_stages=1).options} == {None}
    assert {o.zero for o in _problem("llama2-13b", "a100-40g:16", 64).options} == {None}


def test_api_defaults_are_the_old_values_and_the_cli_passes_default():
    """SolveOptions() keeps the old values (API callers, oracles); the CLI's unset flags mean "default"."""
    from haap_milp.cli.solve_cmds import _options, _zero
    assert SolveOptions().vpp == 1 and SolveOptions().cp == 1 and SolveOptions().zero is None
    o = _options("auto", 10.0, 2, "any", None, 0.01, 0, "auto", _zero(None, None, False))
    assert (o.vpp, o.cp, o.zero) == ("default", "default", "default")
    assert _zero(None, 3, False) is None and _zero(None, None, True) is None  # a fixed stage: not searched


def test_solve_space_is_what_the_cli_solve_searches_without_dimension_flags():
    """SOLVE_SPACE (the bench's `search: solve`, solve_scaling.py --cli-defaults) is the SolveOptions that `haap-solve
    solve` builds when none of --vpp/--cp/--zero/--zero-stage/--no-dist-opt is given: the two cannot drift apart."""
    import inspect

    from haap_milp.cli import solve_cmds
    from haap_milp.specs.solve import SOLVE_SPACE

    p = inspect.signature(solve_cmds.solve).parameters
    opts = solve_cmds._options("auto", 10.0, 2, "any", None, 0.01, 0, p["mixed_stages"].default,
                               solve_cmds._zero(p["zero"].default, p["zero_stage"].default, p["no_dist_opt"].default),
                               p["vpp"].default, p["cp"].default, p["etp"].default)
    assert {k: getattr(opts, k) for k in SOLVE_SPACE} == SOLVE_SPACE
