"""`haap-solve solve` and `haap-solve compare`: parsing and printing only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from haap_milp import planner
from haap_milp.catalog import DEFAULT_CLUSTER, DEFAULT_MODEL, load_cluster, load_model
from haap_milp.cli.common import HEADROOM_HELP, console, err_console, finite, flag_error, parse_headroom, print_json
from haap_milp.cli.economics_opts import (
    MaxCostOpt,
    MaxPointsOpt,
    MaxTimeOpt,
    MinTpsOpt,
    ObjectiveOpt,
    PriceKindOpt,
    PricesOpt,
    RobustOpt,
    StepOpt,
    goal_from_flags,
    price_book,
)
from haap_milp.cli.network_cmd import NetworkOpt
from haap_milp.cli.profile_opts import (
    ProfileDeviceOpt,
    ProfileFallbackOpt,
    ProfileOpt,
    profile_from_flags,
    warn_priced_by_fallback,
)
from haap_milp.cli.runtime_opts import (
    PRECISION_HELP,
    BucketOpt,
    EngineOpt,
    GradOverlapOpt,
    MbsOpt,
    NoDistOptOpt,
    OptStateOpt,
    ParamOverlapOpt,
    RecomputeSetOpt,
    RuntimeFlags,
    TrainingFileOpt,
    UniformOpt,
    ZeroOpt,
    ZeroSearchOpt,
    build_training,
    zero_search,
)
from haap_milp.cli.typer_app import app
from haap_milp.deadline import Deadline, run_interruptible
from haap_milp.errors import HaapInputError
from haap_milp.methods import LISTED
from haap_milp.network.merge import apply_network_option
from haap_milp.outputs import check_output_dir, check_output_file, write_atomic
from haap_milp.planfile import solution_document
from haap_milp.presolve import presolve_document
from haap_milp.report.tables import compare_table, plan_metrics, solve_report
from haap_milp.specs import SolveOptions
from haap_milp.targets import TARGET_NAMES

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Catalog name, HF config.json or YAML.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Catalog name, YAML, or 'a100-80g:64,h100-80g:32'.")]
GbsOpt = Annotated[int | None, typer.Option("--gbs", help="Global batch, sequences (default: 512).")]
SeqOpt = Annotated[int | None, typer.Option("--seq", help="Sequence length (default: 4096).")]
PrecOpt = Annotated[str | None, typer.Option("--precision", help=PRECISION_HELP + " Default: bf16.")]
TimeOpt = Annotated[float, typer.Option("--time-limit", help="Seconds for the whole command (presolve, heuristics, "
                                        "exact search, report); then the best plan with its proven gap.")]
ThreadsOpt = Annotated[int, typer.Option("--threads", help="Solver threads; with 2 or more (and 2 CPUs) a search past "
                                         "0.2 s also runs its nodes on 2 worker processes (eq. PAR2), and on one GPU "
                                         "type the DP heuristic runs beside the exact search (eq. PAR4).")]
TargetOpt = Annotated[str, typer.Option("--target", help=" | ".join(TARGET_NAMES) + ".")]  # the target registry
SolverOpt = Annotated[str, typer.Option("--solver", help=" | ".join(("auto", *LISTED)) + ".")]  # the method registry
StagesOpt = Annotated[int | None, typer.Option("--max-stages", help="Upper limit on pipeline stages.")]
GapOpt = Annotated[float, typer.Option("--gap", help="Relative optimality gap to stop at.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.")]


HeadroomOpt = Annotated[str | None, typer.Option("--memory-headroom", help=HEADROOM_HELP)]
MixedOpt = Annotated[str, typer.Option("--mixed-stages", help="auto | on | off: stages whose data-parallel replicas "
                                       "differ in GPU type and tp, each type taking its share of every micro-batch "
                                       "(formulations/ eqs. H1-H7). auto: on for --target any without --uniform.")]
CpOpt = Annotated[str, typer.Option("--cp", help="auto | N: context-parallel degree (ring attention, formulations/ "
                                    "eqs. CP1-CP3, one per plan); auto searches every cp with seq % (2*cp) == 0 up "
                                    "to 16. Unset (default): auto from --seq 32768 up, else 1 (formulations/ eq. D1).")]
EtpOpt = Annotated[str, typer.Option("--etp", help="auto | N: expert-tensor-parallel degree of MoE layers (eq. CP4, "
                                     "per stage); auto searches the divisors of the expert FFN that fit a node. "
                                     "Default 1.")]


def parse_degree(value: str, flag: str):
    """'auto' or a positive integer (one paragraph naming the flag otherwise)."""
    v = value.strip().lower()
    if v in ("auto", "default"):
        return v
    if v.isdigit() and int(v) >= 1:
        return int(v)
    raise HaapInputError(f"{flag} {value!r}: use auto or a positive integer (e.g. {flag} 2).", field=flag, value=value)


def _inputs(model: str, cluster: str, gbs: int | None, seq: int | None, precision: str | None,
            headroom: str | None = None, training_file: str | None = None, runtime: RuntimeFlags | None = None):
    """Model, cluster and TrainingSpec (defaults < --training FILE < flags; README "Training runtime")."""
    fraction = parse_headroom(headroom) if headroom is not None else None  # flags first: a typo fails early
    base = {"global_batch_size": gbs, "seq_len": seq, "precision": precision, "memory_headroom_fraction": fraction}
    training = build_training(training_file, base, runtime or RuntimeFlags())
    return load_model(model), load_cluster(cluster), training


VppOpt = Annotated[str, typer.Option("--vpp", help="auto | N: interleaved 1F1B chosen by the search (formulations/ "
                                     "eqs. I1-I5): N searches vpp 1 and N, auto vpp 1-4 where the target "
                                     "interleaves; 1: plain 1F1B. Unset (default): auto where the 1F1B "
                                     "fill/drain share at the smallest micro-batch and deepest pipeline is >= 10 %, "
                                     "else 1 (formulations/ eq. D2).")]


def _vpp(value: str) -> int | str:
    """--vpp as SolveOptions takes it (auto or a whole number >= 1; anything else: exit 2, one paragraph)."""
    if value in ("auto", "default"):
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise HaapInputError(f"--vpp {value!r}: use auto or a whole number >= 1 (model chunks per pipeline "
                             f"stage).", field="--vpp", value=value)
    return n


def _zero(text: str | None, zero_stage: int | None, no_dist_opt: bool):
    """--zero as SolveOptions.zero; with none of --zero, --zero-stage, --no-dist-opt given: "default" (eq. D3:
    searched under the fsdp runtime, the runtime's stage elsewhere)."""
    if text is None and zero_stage is None and not no_dist_opt:
        return "default"
    return zero_search(text, zero_stage, False if no_dist_opt else None)


def _options(solver, time_limit, threads, target, max_stages, gap, seed, mixed: str = "auto", zero=None,
             vpp: str = "default", cp: str = "default", etp: str = "1") -> SolveOptions:
    finite(time_limit, "--time-limit")
    finite(gap, "--gap")
    vpp_value = _vpp(vpp)
    if mixed not in ("auto", "on", "off"):
        raise HaapInputError(f"--mixed-stages {mixed!r}: use auto, on or off.", field="--mixed-stages", value=mixed)
    try:
        return SolveOptions(solver=solver, time_limit_s=time_limit, threads=threads, target=target,
                            max_stages=max_stages, relative_gap=gap, seed=seed, mixed_stages=mixed, zero=zero,
                            vpp=vpp_value, cp=parse_degree(cp, "--cp"), etp=parse_degree(etp, "--etp"))
    except ValidationError as exc:
        raise flag_error(exc) from None


@app.command()
def solve(
    model: ModelOpt = DEFAULT_MODEL,
    cluster: ClusterOpt = DEFAULT_CLUSTER,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    precision: PrecOpt = None,
    solver: SolverOpt = "auto",
    time_limit: TimeOpt = 60.0,
    threads: ThreadsOpt = 2,
    target: TargetOpt = "any",
    max_stages: StagesOpt = None,
    gap: GapOpt = 0.01,
    seed: SeedOpt = 0,
    network: NetworkOpt = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the result JSON here ('-' = stdout).")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write timeline and memory plots to this folder.")] = None,
    memory_headroom: HeadroomOpt = None,
    profile: ProfileOpt = [],  # noqa: B006
    profile_device: ProfileDeviceOpt = [],  # noqa: B006
    profile_fallback: ProfileFallbackOpt = None,
    training_file: TrainingFileOpt = None,
    engine: EngineOpt = None,
    zero_stage: ZeroOpt = None,
    zero: ZeroSearchOpt = None,
    no_dist_opt: NoDistOptOpt = False,
    optimizer_state_bytes: OptStateOpt = None,
    grad_overlap: GradOverlapOpt = None,
    param_overlap: ParamOverlapOpt = None,
    grad_bucket: BucketOpt = None,
    recompute: RecomputeSetOpt = None,
    mbs: MbsOpt = None,
    uniform: UniformOpt = None,
    objective: ObjectiveOpt = "time",
    max_cost_per_hour: MaxCostOpt = None,
    min_tokens_per_s: MinTpsOpt = None,
    max_iteration_time: MaxTimeOpt = None,
    robust: RobustOpt = None,
    max_points: MaxPointsOpt = 8,
    step: StepOpt = 0.05,
    prices: PricesOpt = None,
    price: PriceKindOpt = "on_demand",
    mixed_stages: MixedOpt = "auto",
    vpp: VppOpt = "default",
    cp: CpOpt = "default",
    etp: EtpOpt = "1",
) -> None:
    """Find the plan with the shortest iteration time (or least cost or energy) that fits, with its gap."""
    dl = Deadline.for_command(time_limit)  # --time-limit bounds the whole command; Ctrl-C keeps the best plan
    if json_file is not None and str(json_file) != "-":
        check_output_file(json_file, "--json")
    if plot is not None:
        check_output_dir(plot, "--plot")
    rt = RuntimeFlags(engine, zero_stage, False if no_dist_opt else None, optimizer_state_bytes, grad_overlap,
                      param_overlap, grad_bucket, recompute, mbs, uniform)
    m, c, training = _inputs(model, cluster, gbs, seq, precision, memory_headroom, training_file, rt)
    c = apply_network_option(c, network)
    opts = _options(solver, time_limit, threads, target, max_stages, gap, seed, mixed_stages,
                    _zero(zero, zero_stage, no_dist_opt), vpp, cp, etp)
    prof = profile_from_flags(profile, profile_device, profile_fallback, training.precision)
    book = price_book(prices, price, c)
    goal = goal_from_flags(objective, max_cost_per_hour, min_tokens_per_s, max_iteration_time, robust,
                           training.global_batch_size * training.seq_len, max_points, step)
    out, goal_doc = run_interruptible(lambda: _plan(m, c, training, opts, prof, dl, book, goal), dl, _stopping)
    warn_priced_by_fallback([str(e) for e in out.presolved.analytic] if out.presolved else [])
    replayed = _check_interleaved_replay(out)
    metrics = plan_metrics(out, book)  # once: the JSON and the report share it
    doc = solution_document(out.result, m, c, training, {**metrics, "objective": goal_doc},
                            presolve_document(out.presolved))
    if json_file is not None and str(json_file) == "-":
        print_json(doc)
    else:
        solve_report(out, console, book, goal_doc, metrics)
        if json_file is not None:
            import json

            write_atomic(json_file, json.dumps(doc, indent=2), flag="--json")
            console.print(f"wrote {json_file}")
    if plot is not None and out.result.plan is not None:
        _plot_plan(out, plot, err_console if json_file is not None and str(json_file) == "-" else console, replayed)
    elif plot is not None:
        err_console.print(f"--plot: no plots written: no plan ({out.result.status.value})", style="yellow")
    if dl.interrupted:
        _interrupted(out.result)
    if out.result.status.value in ("ERROR",):
        raise SystemExit(1)


def _plan(m, c, training, opts, prof, dl, book, goal):
    """(outcome, objective block): the plain time solve, or objectives.plan_for (cost, energy, bounds, robust)."""
    if goal.plain:
        return planner.solve(m, c, training, opts, profile=prof, deadline=dl), {"objective": "time"}
    from haap_milp import objectives
    from haap_milp.deadline import use

    with use(dl):
        ctx = planner.Context.build(m, c, training, opts, profile=prof)
    ans = objectives.plan_for(ctx, book, goal, deadline=dl)
    return ans.outcome, ans.doc


def _stopping() -> None:
    err_console.print("stopping: Ctrl-C again to abort without a plan", style="yellow")


# an interleaved plan is replayed after the search when its replay has at most this many events (~10 us each)
REPLAY_CHECK_EVENTS = 20_000
REPLAY_CHECK_RTOL = 0.05  # ... and a warning printed when the replay is this much slower than the objective


def _check_interleaved_replay(out):
    """Eqs. I1 and I7 price interleaved plans up to 26 % above and 9 % below the event replay on random pipelines,
    the fill and drain over slow links the part still below it (README, 'Where haap falls short'): an interleaved
    plan is replayed (if small enough) and a warning names the difference when the replay is REPLAY_CHECK_RTOL
    slower. Returns the replay (``simulate.SimulationResult``, which --plot draws) or None."""
    from haap_milp import simulate

    plan = out.result.plan
    if plan is None or plan.vpp <= 1 or simulate.replay_events(plan.pp, plan.num_microbatches, plan.vpp) > \
            REPLAY_CHECK_EVENTS:
        return None
    claimed = out.result.objective_s
    sim = simulate.simulate_plan(plan, out.estimator)
    replay = sim.iteration_time_s
    if claimed and replay > claimed * (1 + REPLAY_CHECK_RTOL):
        err_console.print(f"warning: the event replay of this interleaved plan (vpp {plan.vpp}) takes {replay:.3f} s, "
                          f"{100 * (replay / claimed - 1):.0f} % more than its objective {claimed:.3f} s: eqs. I1, I7 "
                          f"underprice its fill and drain over slow links; compare the plan of --vpp 1 (haap-solve simulate replays any plan)",
                          style="yellow", soft_wrap=True)
    return sim


def _plot_plan(out, plot, said, sim=None) -> None:
    """--plot: the plan's replayed timeline and its memory; a plan too long to replay (simulate.MAX_REPLAY_EVENTS)
    gets no plots and a note, the plan and its report stand. ``said``: where the files written are listed (stderr
    when the JSON goes to stdout, which they broke). ``sim``: the plan's replay when made already."""
    from haap_milp import simulate
    from haap_milp.report import plots

    try:
        sim = sim if sim is not None else simulate.simulate_plan(out.result.plan, out.estimator)
    except HaapInputError as exc:
        err_console.print(f"--plot: no plots written: {exc}", style="yellow")
        return
    rows = plots.memory_bars(out.result.plan, out.estimate, out.estimator.cluster)
    for path in plots.plot_folder(plot, sim, rows):
        said.print(f"wrote {path}", soft_wrap=True, highlight=False, markup=False)


def _interrupted(result) -> None:
    """After Ctrl-C: one line on what was kept, exit 130."""
    gap = "unknown" if result.gap is None else f"{100 * result.gap:.2f} %"
    if result.plan is None:
        err_console.print("interrupted: no plan found yet", style="yellow")
    else:
        err_console.print(f"interrupted: best plan so far, gap {gap}", style="yellow")
    raise SystemExit(130)


@app.command()
def compare(
    model: ModelOpt = DEFAULT_MODEL,
    cluster: ClusterOpt = DEFAULT_CLUSTER,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    precision: PrecOpt = None,
    time_limit: TimeOpt = 60.0,
    threads: ThreadsOpt = 2,
    target: TargetOpt = "any",
    max_stages: StagesOpt = None,
    gap: GapOpt = 0.01,
    seed: SeedOpt = 0,
    network: NetworkOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON to stdout instead of a table (a flag here; "
                                           "redirect to save it).")] = False,
    memory_headroom: HeadroomOpt = None,
    profile: ProfileOpt = [],  # noqa: B006
    profile_device: ProfileDeviceOpt = [],  # noqa: B006
    profile_fallback: ProfileFallbackOpt = None,
    training_file: TrainingFileOpt = None,
    engine: EngineOpt = None,
    zero_stage: ZeroOpt = None,
    zero: ZeroSearchOpt = None,
    no_dist_opt: NoDistOptOpt = False,
    optimizer_state_bytes: OptStateOpt = None,
    grad_overlap: GradOverlapOpt = None,
    param_overlap: ParamOverlapOpt = None,
    grad_bucket: BucketOpt = None,
    recompute: RecomputeSetOpt = None,
    mbs: MbsOpt = None,
    uniform: UniformOpt = None,
    mixed_stages: MixedOpt = "auto",
    prices: PricesOpt = None,
    price: PriceKindOpt = "on_demand",
    vpp: VppOpt = "default",
    cp: CpOpt = "default",
    etp: EtpOpt = "1",
) -> None:
    """Run CP-SAT, MILP, the DP heuristic and the uniform Megatron-style baseline on one problem."""
    dl = Deadline.for_command(time_limit)  # --time-limit bounds the whole command, input loading included
    rt = RuntimeFlags(engine, zero_stage, False if no_dist_opt else None, optimizer_state_bytes, grad_overlap,
                      param_overlap, grad_bucket, recompute, mbs, uniform)
    m, c, training = _inputs(model, cluster, gbs, seq, precision, memory_headroom, training_file, rt)
    c = apply_network_option(c, network)
    opts = _options("auto", time_limit, threads, target, max_stages, gap, seed, mixed_stages,
                    _zero(zero, zero_stage, no_dist_opt), vpp, cp, etp)
    prof = profile_from_flags(profile, profile_device, profile_fallback, training.precision)
    book = price_book(prices, price, c)
    outs = run_interruptible(lambda: planner.compare(m, c, training, opts, profile=prof, deadline=dl), dl,
                             _stopping)
    pre = next((o.presolved for o in outs.values() if o.presolved is not None), None)
    warn_priced_by_fallback([str(e) for e in pre.analytic] if pre else [])
    if json_out:  # one entry per method (the search is the same for all: each carries excluded / profile)
        print_json({k: {**plan_metrics(o, book), "status": o.result.status.value, "bound_s": o.result.bound_s,
                        "gap": o.result.gap, "wall_time_s": o.result.wall_time_s,
                        "plan": o.result.plan.model_dump(mode="json") if o.result.plan else None,
                        **presolve_document(o.presolved)}
                    for k, o in outs.items()})
    else:
        compare_table(outs, console, book)
    if dl.interrupted:
        raise SystemExit(130)
