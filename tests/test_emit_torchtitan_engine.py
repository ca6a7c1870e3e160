"""torchtitan's own code on every emitted torchtitan config (torchtitan 0.3.0 from PyPI, installed by .ci/run).

For each plan torchtitan can run (the hand-made cases and every catalog model, MoE included): the emitted
``haap_torchtitan.py`` goes through ``ConfigManager.parse_args`` with the exact arguments of ``launch.sh``
(tyro parsing and every ``__post_init__`` check of the trainer config), then the model it defines is built on
the meta device by torchtitan's own ``Module.Config.build`` and compared with the planned shapes: parameter
count (haap's count plus the q/k-norm weights it leaves out, tests/test_catalog_models.py), layers, vocabulary,
experts. Skipped without torchtitan (``pip install torchtitan==0.3.0 triton``).
"""

from __future__ import annotations

import shlex

import pytest
from _emit_cases import A100_16, CASES, LLAMA8B
from test_emit_catalog import plan_for

from haap_milp.catalog.data import model_entry, model_names
from haap_milp.emit import EmitError, emit
from haap_milp.specs import Plan, StagePlan


def _torchtitan():
    try:
        import torch
        import torchtitan.models.llama3.config_registry  # noqa: F401  (imports the trainer, triton included)
        from torchtitan.config import ConfigManager
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"torchtitan 0.3.0 with its trainer dependencies not importable ({type(exc).__name__}: {exc})")
    return torch, ConfigManager


def _single_stage_plan() -> Plan:
    st = (StagePlan(first_layer=0, num_layers=LLAMA8B.num_layers, gpu_type="a100-80g", tp=2, dp=8, recompute="full"),)
    return Plan(model=LLAMA8B.name, stages=st, micro_batch_size=2, num_microbatches=4, global_batch_size=64,
                seq_len=4096)


def _runnable():
    """(label, plan, model, cluster) for every plan the torchtitan emitter accepts."""
    one = _single_stage_plan()
    out = [("pp1-full", one, LLAMA8B, A100_16)]
    for z in (2, 3):  # formulations/ eq. Z1: single-stage ZeRO-2 / ZeRO-3 (fsdp_reshard_after_forward never / always)
        out.append((f"pp1-zero{z}", one.model_copy(update={"stages": (one.stages[0].model_copy(update={"zero": z}),)}),
                    LLAMA8B, A100_16))
    for case, (factory, model, cluster, ok) in CASES.items():
        if "torchtitan" in ok:
            out.append((f"case-{case}", factory(), model, cluster))
    for name in model_names():
        plan, model = plan_for(name), model_entry(name).spec
        try:
            emit(plan, "torchtitan", A100_16, model)
        except EmitError:
            continue
        out.append((name, plan, model, A100_16))
    return out


RUNNABLE = _runnable()


def test_catalog_models_torchtitan_runs():
    """The catalog models torchtitan 0.3.0 builds (llama2 / llama3 families, qwen3 MoE); the rest are refused
    with the reason in tests/test_emit_catalog.py."""
    names = {label for label, *_ in RUNNABLE if not label.startswith(("case-", "pp1"))}
    assert {"llama2-7b", "llama2-70b", "llama3-8b", "llama3-405b", "qwen3-235b-a22b"} <= names
    assert not names & {"mixtral-8x7b", "qwen2.5-7b", "gpt3-1.3b", "opt-350m", "gpt-neo-2.7b"}


def _launch_argv(files: dict, tmp_path) -> list[str]:
    """The arguments launch.sh passes after ``--config haap_plan``, with the user's inputs filled in."""
    text = files["launch.sh"]
    tail = text[text.index("--config haap_plan") + len("--config haap_plan"):]
    argv = shlex.split(tail.replace("\\\n", " ").replace("${TORCHTITAN_EXTRA_ARGS:-}", ""))
    env = {"$HF_ASSETS_PATH": str(tmp_path), "$DATASET": "c4_test", "$DUMP_FOLDER": str(tmp_path / "out")}
    return [env.get(a, a) for a in argv]


@pytest.mark.parametrize("label,plan,model,cluster", RUNNABLE, ids=[r[0] for r in RUNNABLE])
def test_torchtitan_accepts_emitted_config_and_builds_the_planned_model(label, plan, model, cluster, tmp_path,
                                                                      monkeypatch):
    torch, ConfigManager = _torchtitan()
    files = emit(plan, "torchtitan", cluster, model)
    name = "haap_tt_" + "".join(c if c.isalnum() else "_" for c in label)
    (tmp_path / f"{name}.py").write_text(files["haap_torchtitan.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = _launch_argv(files, tmp_path)
    assert "--dump_folder" in argv and "--hf_assets_path" in argv
    cfg = ConfigManager().parse_args(["--module", name, "--config", "haap_plan", *argv])  # tyro + __post_init__
    assert cfg.dump_folder == str(tmp_path / "out") and cfg.hf_assets_path == str(tmp_path)
    par, s = cfg.parallelism, plan.stages[0]
    assert par.pipeline_parallel_degree == plan.pp and par.tensor_parallel_degree == s.tp
    assert par.data_parallel_shard_degree * par.data_parallel_replicate_degree == s.dp
    assert cfg.training.global_batch_size == plan.global_batch_size and cfg.training.seq_len == plan.seq_len
    if model.is_moe:
        assert par.expert_parallel_degree == s.ep
    if s.zero is not None:  # eq. Z1: the ZeRO stage as torchtitan's own config reads it
        assert par.data_parallel_shard_degree == (s.dp if s.zero >= 1 else 1)
        want = {2: "never", 3: "always"}.get(s.zero, "default") if plan.pp == 1 else "default"
        assert par.fsdp_reshard_after_forward == want
    mcfg = cfg.model_spec.model
    assert mcfg.vocab_size == model.vocab_size and len(mcfg.layers) == model.num_layers
    assert cfg.loss.loss_fn.global_vocab_size == model.vocab_size
    with torch.device("meta"):
        built = mcfg.build()
    total = sum(p.numel() for p in built.parameters())
    qk_norms = 2 * model.dim_head * model.num_layers if model.qk_norm else 0  # per-head q/k RMSNorm weights
    assert total == model.num_params_total + qk_norms
    layer0 = dict(built.layers["0"].named_parameters())
    wqkv = layer0["attention.qkv_linear.wqkv.weight"]
    assert tuple(wqkv.shape) == ((model.num_heads + 2 * model.kv_heads) * model.dim_head, model.hidden)
    if model.is_moe:
        assert tuple(layer0["moe.routed_experts.inner_experts.w1_EFD"].shape) == (
            model.num_experts, model.expert_ffn, model.hidden)
    rope = mcfg.layers[0].attention.rope
    assert rope.theta == model.rope_base
    # the pipeline split names real modules of the built model
    names = {n.split(".")[0] for n, _ in built.named_children()} | {f"layers.{i}" for i in range(model.num_layers)}
    assert {m for part in par.module_fqns_per_model_part for m in part} <= names


def test_torchtitan_validation_is_live(tmp_path, monkeypatch):
    """The same path refuses what torchtitan refuses: pipeline parallelism with CUDA graphs left on."""
    _, ConfigManager = _torchtitan()
    _, plan, model, cluster = next(r for r in RUNNABLE if r[1].pp > 1)
    text = emit(plan, "torchtitan", cluster, model)["haap_torchtitan.py"]
    assert "disable_cuda_graphs = True" in text
    (tmp_path / "haap_tt_live.py").write_text(text.replace("disable_cuda_graphs = True", "disable_cuda_graphs = False"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit):  # tyro reports the trainer's ValueError and exits
        ConfigManager().parse_args(["--module", "haap_tt_live", "--config", "haap_plan", "--hf_assets_path",
                                    str(tmp_path)])


@pytest.mark.parametrize("case", ["llama_hetero", "hetero_uniform"])
def test_torchtitan_device_mesh_puts_each_stage_on_its_planned_gpus(case):
    """torchtitan's own ParallelDims (distributed/parallel_dims.py, pp outermost) on a fake process group of the
    plan's world size: rank 0's pipeline group holds the first rank of each stage block of the placement, and its
    tensor-parallel group the ranks next to it, so launch.sh's node order puts every stage on its GPU type."""
    _torchtitan()
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed.parallel_dims import ParallelDims

    from haap_milp.emit.placement import place
    from haap_milp.emit.torchtitan import parallelism

    factory, model, cluster, _ = CASES[case]
    plan = factory()
    placement = place(plan, cluster)
    dims = ParallelDims.from_config(ParallelismConfig(**parallelism(plan, model)), placement.world_size)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=placement.world_size)
    try:
        dims.build_mesh()
        pp_group = dims.get_mesh("pp").mesh.tolist()
        tp_group = dims.get_mesh("tp").mesh.tolist()
    finally:
        dist.destroy_process_group()
    starts = [sum(s.tp * s.dp * plan.cp for s in plan.stages[:j]) for j in range(plan.pp)]
    assert pp_group == starts
    assert [placement.stage_of_rank(r) for r in pp_group] == list(range(plan.pp))
    assert tp_group == list(range(plan.stages[0].tp))
    for j, s in enumerate(plan.stages):
        node = next(n for n in placement.nodes if n.first_rank <= starts[j] < n.first_rank + n.nproc)
        assert node.gpu_type == s.gpu_type
