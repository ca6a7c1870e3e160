"""`haap-solve estimate`: time and memory of one plan (parsing and printing only).

Exit codes: 0 when the plan fits; 2 for impossible inputs (one paragraph) and for a plan that does
not fit in memory - the full estimate is still printed (table or JSON with ``fits: false``), then one
paragraph starting "DOES NOT FIT" with the stage, the GiB needed and the GiB usable.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from haap_milp.catalog import load_cluster, load_model
from haap_milp.cli.common import (
    HEADROOM_HELP,
    console,
    enforce_plan,
    err_console,
    parse_headroom,
    print_json,
)
from haap_milp.cli.economics_opts import PriceKindOpt, PricesOpt, price_book
from haap_milp.cli.network_cmd import NetworkOpt
from haap_milp.cli.profile_opts import (
    ProfileDeviceOpt,
    ProfileFallbackOpt,
    ProfileOpt,
    profile_from_flags,
    unmeasured_stages,
    warn_priced_by_fallback,
)
from haap_milp.cli.runtime_opts import (
    PRECISION_HELP,
    BucketOpt,
    EngineOpt,
    GradOverlapOpt,
    OptStateOpt,
    ParamOverlapOpt,
    RuntimeFlags,
    TrainingFileOpt,
    ZeroOpt,
    build_training,
    zero_search,
)
from haap_milp.cli.typer_app import app
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator, PlanEstimate, load_calibration
from haap_milp.estimator.kernels import MODERN, MOE_DISPATCHERS, Implementation, parse_recompute_modules
from haap_milp.estimator.runtime import describe as describe_runtime
from haap_milp.explain import estimate_bottleneck
from haap_milp.network.merge import apply_network_option
from haap_milp.planfile import read_plan_file
from haap_milp.specs import ClusterSpec, ModelSpec, Plan, StagePlan, TrainingSpec

Opt = typer.Option


def _check_uniform(model: ModelSpec, cluster: ClusterSpec, gbs: int, tp: int, pp: int, dp: int, mbs: int, cp: int,
                   ep: int, vpp: int, etp: int = 1) -> None:
    if len(cluster.gpu_types) != 1:
        raise HaapInputError(f"the flag form estimates a uniform plan on one GPU type; cluster {cluster.name!r} has "
                             f"{', '.join(cluster.gpu_types)} - write a plan file and use --plan.", field="cluster")
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp), ("mbs", mbs), ("cp", cp), ("ep", ep), ("etp", etp), ("vpp", vpp)):
        if v < 1:
            raise HaapInputError(f"--{name}={v} must be at least 1.", field=name, value=v)
    if tp * pp * dp * cp != cluster.total_gpus:
        raise HaapInputError(f"tp x pp x dp x cp = {tp}x{pp}x{dp}x{cp} = {tp * pp * dp * cp} GPUs, but cluster "
                             f"{cluster.name!r} has {cluster.total_gpus}.", field="dp", value=dp)
    if gbs % (mbs * dp):
        raise HaapInputError(f"--gbs {gbs} is not divisible by mbs x dp = {mbs}x{dp} = {mbs * dp} (Megatron rule).",
                             field="gbs", value=gbs)
    if pp > model.num_layers:
        raise HaapInputError(f"--pp {pp} exceeds the {model.num_layers} layers of {model.name}.", field="pp", value=pp)
    if vpp > 1 and model.num_layers % (pp * vpp):
        # the flag form is Megatron's --num-virtual-stages-per-pipeline-rank, which needs equal virtual stages
        raise HaapInputError(f"--vpp {vpp} does not divide the layers per stage: {model.name} has {model.num_layers} "
                             f"layers, not divisible by pp x vpp = {pp}x{vpp} = {pp * vpp}; uneven virtual stages "
                             "need a plan file (--plan).", field="vpp", value=vpp)
    if model.num_heads % tp:
        raise HaapInputError(f"--tp {tp} does not divide the {model.num_heads} attention heads of {model.name}.",
                             field="tp", value=tp)
    if ep > 1 and (not model.is_moe or model.num_experts % ep):
        raise HaapInputError(f"--ep {ep} must divide the experts of {model.name} ({model.num_experts}).",
                             field="ep", value=ep)


def uniform_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tp: int, pp: int, dp: int, mbs: int,
                 vpp: int, recompute: str, ep: int, etp: int, cp: int) -> Plan:
    """Megatron-style plan: even layer split (the first stages take the remainder), the first stage also
    holds the embedding and the last one the LM head."""
    group = cluster.node_groups[0]
    base, extra = divmod(model.num_layers, pp)
    stages, pos = [], 0
    for j in range(pp):
        n = base + (1 if j < extra else 0)
        stages.append(StagePlan(first_layer=pos, num_layers=n, gpu_type=group.gpu.name, island=group.island, tp=tp,
                                dp=dp, ep=ep, etp=etp, recompute=recompute))
        pos += n
    return Plan(model=model.name, cluster=cluster.name, stages=tuple(stages), micro_batch_size=mbs,
                num_microbatches=training.global_batch_size // (mbs * dp), global_batch_size=training.global_batch_size,
                seq_len=training.seq_len, precision=training.precision,
                schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp, cp=cp,
                sequence_parallel=training.sequence_parallel, distributed_optimizer=training.distributed_optimizer)


def estimate_document(pe: PlanEstimate, est: Estimator, plan: Plan) -> dict[str, Any]:
    bound = est.compute_bound()
    doc = pe.as_dict()
    doc["stages"] = [{**s, **{k: getattr(plan.stages[s["index"]], k) for k in ("tp", "dp", "ep", "recompute")}}
                     for s in doc["stages"]]
    doc["compute_bound"] = {"tokens_per_s": bound.tokens_per_s, "iteration_time_s": bound.iteration_time_s,
                            "fraction_reached": pe.tokens_per_s / bound.tokens_per_s if bound.tokens_per_s else None}
    doc["calibration"] = {g: est.calibration.params(est.cluster.gpu(g)).source for g in est.cluster.gpu_types}
    doc["micro_batches"] = plan.num_microbatches
    doc["seq_len"], doc["global_batch_size"], doc["precision"] = plan.seq_len, plan.global_batch_size, plan.precision
    doc["runtime"] = describe_runtime(est.training)
    doc["recompute_modules"], doc["moe_dispatcher"] = list(est.impl.recompute_modules), est.impl.moe_dispatcher
    return doc


def _table(pe: PlanEstimate, plan: Plan, training: TrainingSpec) -> None:
    console.print(f"iteration {pe.iteration_time_s:.3f} s | {pe.tokens_per_s:,.0f} tokens/s | "
                  f"{pe.tflops_per_gpu:.1f} TFLOP/s/GPU (hw {pe.hw_tflops_per_gpu:.1f}) | MFU {pe.mfu:.1%}",
                  highlight=False)
    console.print(f"peak memory {pe.peak_memory_gib:.1f} GiB | {pe.num_gpus} GPUs | {plan.schedule}, "
                  f"{plan.num_microbatches} micro-batches", highlight=False)
    rt = describe_runtime(training)
    bucket = f", bucket {rt['grad_bucket_bytes']:.3g} B" if rt["grad_bucket_bytes"] else ""
    zs = [rt["zero_stage"] if s.zero is None else s.zero for s in plan.stages]  # eq. Z1: per stage when set
    zero = str(zs[0]) if len(set(zs)) == 1 else "/".join(map(str, zs))
    console.print(f"seq {plan.seq_len} | gbs {plan.global_batch_size} | {plan.precision} | {rt['engine']}, ZeRO "
                  f"{zero}, grad overlap {'on' if rt['grad_reduce_overlap'] else 'off'}, param overlap "
                  f"{'on' if rt['param_gather_overlap'] else 'off'}{bucket}", highlight=False, markup=False)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
              caption="seconds per iteration; comm = exposed TP + EP + CP communication; ! = does not fit")
    for col in ("st", "gpu", "L", "tp*dp", "rc", "ms/mb", "GiB/cap", "comp s", "comm s", "p2p s", "bub s", "sync s"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in pe.stages:
        b, sp = s.breakdown, plan.stages[s.index]
        mem = f"{s.memory_gib:.1f}/{s.capacity_gib:.0f}" + ("" if s.fits else "!")
        comm = b["tp_comm_s"] + b["ep_comm_s"] + b["cp_comm_s"]
        gpu = "+".join(r.gpu_type for r in sp.replicas) or s.gpu_type  # a mixed stage: each replica type
        grid = "+".join(f"{r.tp}*{r.count}" for r in sp.replicas) or f"{sp.tp}*{sp.dp}"
        t.add_row(str(s.index), gpu, str(s.num_layers), grid, sp.recompute[:4],
                  f"{s.time_s * 1e3:.1f}", mem, f"{b['compute_s']:.2f}", f"{comm:.2f}", f"{b['p2p_s']:.2f}",
                  f"{b['bubble_s']:.2f}", f"{b['sync_s']:.2f}")
    Console(width=max(console.width, 112), highlight=False).print(t)  # wide table even when piped
    for note in pe.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(f"why: {estimate_bottleneck(pe, plan)}", highlight=False, markup=False)


def _implementation(recompute_modules: str | None, moe_dispatcher: str | None) -> Implementation:
    """The engine's kernel choices from --recompute-modules and --moe-dispatcher (estimator/kernels.py)."""
    impl = MODERN
    if recompute_modules is not None:
        impl = replace(impl, recompute_modules=parse_recompute_modules(recompute_modules))
    if moe_dispatcher is not None:
        if moe_dispatcher not in MOE_DISPATCHERS:
            raise HaapInputError(f"--moe-dispatcher {moe_dispatcher!r} must be one of {', '.join(MOE_DISPATCHERS)} "
                                 "(Megatron-Core --moe-token-dispatcher-type; flex = DeepEP).", field="moe_dispatcher",
                                 value=moe_dispatcher)
        impl = replace(impl, moe_dispatcher=moe_dispatcher)
    return impl


def _resolve(plan_path: str | None, model: str | None, cluster: str | None, gbs, seq, precision, sp, dist_opt,
             headroom: str | None = None, training_file: str | None = None, runtime: RuntimeFlags | None = None):
    """(model, cluster, training, plan or None). Training: defaults (the same as ``solve``: seq 4096, gbs 512)
    < the plan file's training < --training FILE < flags; a plan's batch, sequence, precision and flags win,
    except ``--dist-opt/--no-dist-opt`` given explicitly, which re-prices the plan with or without it."""
    fraction = parse_headroom(headroom) if headroom is not None else None
    rt = runtime or RuntimeFlags(dist_opt=dist_opt)
    if plan_path:
        pf = read_plan_file(plan_path)
        m = load_model(model) if model else pf.model
        c = load_cluster(cluster) if cluster else pf.cluster
        if m is None or c is None:
            raise HaapInputError(f"plan file {plan_path!r} does not hold the {'model' if m is None else 'cluster'}; "
                                 "pass --model and --cluster.", field="model" if m is None else "cluster")
        p = pf.plan
        if dist_opt is not None and dist_opt != p.distributed_optimizer:  # the flag wins over the plan file's
            p = p.model_copy(update={"distributed_optimizer": dist_opt})
        start = pf.training.model_dump() if pf.training else {}
        tr = build_training(training_file, {"memory_headroom_fraction": fraction}, rt, start)
        tr = tr.model_copy(update={"global_batch_size": p.global_batch_size, "seq_len": p.seq_len,
                                   "precision": p.precision, "sequence_parallel": p.sequence_parallel,
                                   "distributed_optimizer": p.distributed_optimizer})
        return m, c, tr, p
    if not model or not cluster:
        raise HaapInputError("estimate needs --model and --cluster (with --tp/--pp/--dp/--mbs), or --plan FILE.",
                             field="model")
    m, c = load_model(model), load_cluster(cluster)
    base = {"global_batch_size": gbs, "seq_len": seq, "precision": precision, "sequence_parallel": sp,
            "memory_headroom_fraction": fraction}
    return m, c, build_training(training_file, base, rt), None


def _plan_fixes(p, given: dict) -> None:
    """With --plan the plan fixes its shape: a shape flag that says otherwise would be ignored without a word
    (fuzz), so it exits 2 naming the flags; one that repeats the plan's own value is fine (--dist-opt/--no-dist-opt
    and --zero still re-price a plan)."""
    st = p.stages
    plan = {"--gbs": {p.global_batch_size}, "--seq": {p.seq_len}, "--precision": {p.precision},
            "--sp/--no-sp": {p.sequence_parallel}, "--tp": {s.tp for s in st}, "--pp": {len(st)},
            "--dp": {s.dp for s in st}, "--mbs": {p.micro_batch_size}, "--vpp": {p.vpp}, "--cp": {p.cp},
            "--recompute": {s.recompute for s in st}, "--ep": {s.ep for s in st}, "--etp": {s.etp for s in st}}
    unset = {f: inspect.signature(estimate).parameters[f.lstrip("-").split("/")[0]].default for f in given}
    off = [f"{k} {v}" if not isinstance(v, bool) else k.split("/")[0 if v else 1] for k, v in given.items()
           if v != unset[k] and plan[k] != {v}]
    if off:
        raise HaapInputError(f"{', '.join(off)} with --plan: the plan file fixes its batch, sequence, precision and "
                             "parallel layout, and says otherwise; drop these flags, or drop --plan to price a uniform "
                             "plan of them.", field=off[0].split()[0], value=off[0])


def _with_zero(p, text: str | None, zero_stage: int | None, dist_opt: bool | None):
    """The plan with ``--zero N`` on every single-type stage (a mixed stage runs the runtime's stage)."""
    stages = zero_search(text, zero_stage, dist_opt)
    if stages is None:
        return p
    if stages == "auto" or len(stages) != 1:
        raise HaapInputError(f"--zero {text}: estimate prices one plan; give one ZeRO stage (0-3). solve and compare "
                             "search a set.", field="zero", value=text)
    return p.model_copy(update={"stages": tuple(s if s.replicas else s.model_copy(update={"zero": stages[0]})
                                                for s in p.stages)})


@app.command()
def estimate(
    model: Annotated[str | None, Opt("--model", "-m", help="Catalog name, HF config.json or YAML.")] = None,
    cluster: Annotated[str | None, Opt("--cluster", "-c", help="Catalog name, YAML or 'h100-80g:64'.")] = None,
    gbs: Annotated[int | None, Opt("--gbs", help="Global batch, sequences (default: 512, as solve).")] = None,
    seq: Annotated[int | None, Opt("--seq", help="Sequence length (default: 4096, as solve).")] = None,
    tp: Annotated[int, Opt("--tp", help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, Opt("--pp", help="Pipeline stages.")] = 1,
    dp: Annotated[int, Opt("--dp", help="Data-parallel replicas.")] = 1,
    mbs: Annotated[int, Opt("--mbs", help="Micro-batch per replica.")] = 1,
    vpp: Annotated[int, Opt("--vpp", help="Virtual stages per stage (interleaved 1F1B).")] = 1,
    recompute: Annotated[str, Opt("--recompute", help="none | selective | full | op (torchtitan's op-level "
                                  "selective checkpointing).")] = "none",
    recompute_modules: Annotated[str | None, Opt("--recompute-modules", help="What selective recompute "
                                                 "recomputes, Megatron-Core names, comma-separated: core_attn, "
                                                 "layernorm, mlp, moe, moe_act, shared_experts, mla_up_proj "
                                                 "(default core_attn). Implies --recompute selective.")] = None,
    moe_dispatcher: Annotated[str | None, Opt("--moe-dispatcher", help="MoE token dispatcher: alltoall "
                                              "(default), allgather, flex (DeepEP).")] = None,
    sp: Annotated[bool | None, Opt("--sp/--no-sp", help="Sequence parallelism (with tp > 1; default on).")] = None,
    dist_opt: Annotated[bool | None, Opt("--dist-opt/--no-dist-opt", help="Distributed optimizer (ZeRO-1; default "
                                         "on); --no-dist-opt: plain data parallel.")] = None,
    ep: Annotated[int, Opt("--ep", help="Expert-parallel degree.")] = 1,
    etp: Annotated[int, Opt("--etp", help="Expert tensor-parallel degree.")] = 1,
    cp: Annotated[int, Opt("--cp", help="Context-parallel degree.")] = 1,
    precision: Annotated[str | None, Opt("--precision", help=PRECISION_HELP + " Default: bf16.")] = None,
    plan: Annotated[str | None, Opt("--plan", help="Plan JSON or `solve --json` output (any plan).")] = None,
    profile: ProfileOpt = [],  # noqa: B006
    profile_device: ProfileDeviceOpt = [],  # noqa: B006
    profile_fallback: ProfileFallbackOpt = None,
    calibration: Annotated[str | None, Opt("--calibration", help="Calibration JSON (default: packaged).")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON to stdout (a flag here; redirect to save it).")] = False,
    memory_headroom: Annotated[str | None, Opt("--memory-headroom", help=HEADROOM_HELP)] = None,
    network: NetworkOpt = None,
    training_file: TrainingFileOpt = None,
    engine: EngineOpt = None,
    zero_stage: ZeroOpt = None,
    zero: Annotated[str | None, Opt("--zero", help="ZeRO stage 0-3 of every (single-type) stage of the plan, "
                                    "re-pricing it (formulations/ eq. Z1); --dist-opt means 1, --no-dist-opt 0.")] = None,
    optimizer_state_bytes: OptStateOpt = None,
    grad_overlap: GradOverlapOpt = None,
    param_overlap: ParamOverlapOpt = None,
    grad_bucket: BucketOpt = None,
    prices: PricesOpt = None,
    price: PriceKindOpt = "on_demand",
) -> None:
    """Predict iteration time, throughput, MFU, per-stage memory, cost and energy of a plan. Exit 2 if it does not
    fit."""
    if not profile:
        profile_from_flags(profile, profile_device, profile_fallback, None)  # a profile flag alone: exit 2 first
    rt = RuntimeFlags(engine, zero_stage, dist_opt, optimizer_state_bytes, grad_overlap, param_overlap, grad_bucket)
    m, c, training, p = _resolve(plan, model, cluster, gbs, seq, precision, sp, dist_opt, memory_headroom,
                                 training_file, rt)
    if p is not None:
        _plan_fixes(p, {"--gbs": gbs, "--seq": seq, "--precision": precision, "--sp/--no-sp": sp, "--tp": tp,
                        "--pp": pp, "--dp": dp, "--mbs": mbs, "--vpp": vpp, "--recompute": recompute, "--ep": ep,
                        "--etp": etp, "--cp": cp})
    c = apply_network_option(c, network)
    impl = _implementation(recompute_modules, moe_dispatcher)
    if p is None:
        if recompute not in ("none", "selective", "full", "op"):
            raise HaapInputError(f"--recompute {recompute!r} must be none, selective, full or op.", field="recompute")
        if recompute_modules is not None:
            if recompute in ("full", "op"):
                raise HaapInputError("--recompute-modules names what selective recompute recomputes; it cannot go "
                                     f"with --recompute {recompute} (Megatron-Core: --recompute-granularity selective).",
                                     field="recompute_modules", value=recompute_modules)
            recompute = "selective"
        _check_uniform(m, c, training.global_batch_size, tp, pp, dp, mbs, cp, ep, vpp, etp)
        p = uniform_plan(m, c, training, tp, pp, dp, mbs, vpp, recompute, ep, etp, cp)
    p = _with_zero(p, zero, zero_stage, dist_opt)
    # the checker's rules (GPUs, layers, divisibility); memory is reported below with the full estimate
    enforce_plan(p, m, c, training, what=f"plan file {plan!r}" if plan else "the plan of these flags", memory=False)
    cal = load_calibration(calibration) if calibration else None
    prof = profile_from_flags(profile, profile_device, profile_fallback, training.precision)
    est = Estimator(m, c, training, cal, prof, impl=impl)
    pe = est.estimate(p)  # a stage the profile does not cover: one paragraph, exit 2 (estimator.override)
    warn_priced_by_fallback(unmeasured_stages(prof, p))
    from haap_milp.economics import plan_economics

    econ = plan_economics(p, pe, price_book(prices, price, c))  # eqs. E1-E5
    if as_json:
        print_json({**estimate_document(pe, est, p), **econ, "explanation": estimate_bottleneck(pe, p)})
    else:
        _table(pe, p, est.training)
        from haap_milp.report.tables import economics_lines

        console.print("\n".join(economics_lines(econ)), highlight=False, markup=False)
    if not pe.fits:
        err_console.print("DOES NOT FIT: " + "; ".join(pe.not_fitting()) + ". Try more recompute, a smaller "
                          "micro-batch, more pipeline stages or the distributed optimizer.", markup=False,
                          highlight=False, soft_wrap=True)
        raise typer.Exit(2)
