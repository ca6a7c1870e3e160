"""`haap-solve solve` and `haap-solve compare`: parsing and printing only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from haap_milp import planner
from haap_milp.catalog import DEFAULT_CLUSTER, DEFAULT_MODEL, load_cluster, load_model
from haap_milp.cli.app import app
from haap_milp.cli.common import HEADROOM_HELP, console, err_console, finite, flag_error, parse_headroom, print_json
from haap_milp.cli.network_cmd import NetworkOpt
from haap_milp.deadline import Deadline, run_interruptible
from haap_milp.methods import LISTED
from haap_milp.network.merge import apply_network_option
from haap_milp.outputs import check_output_dir, check_output_file, write_atomic
from haap_milp.planfile import solution_document
from haap_milp.specs import SolveOptions, TrainingSpec
from haap_milp.tables import compare_table, plan_metrics, solve_report
from haap_milp.targets import TARGET_NAMES

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Catalog name, HF config.json or YAML.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Catalog name, YAML, or 'a100-80g:64,h100-80g:32'.")]
GbsOpt = Annotated[int, typer.Option("--gbs", help="Global batch, sequences.")]
SeqOpt = Annotated[int | None, typer.Option("--seq", help="Sequence length (default: 4096).")]
PrecOpt = Annotated[str, typer.Option("--precision", help="bf16 | fp16 | fp8.")]
TimeOpt = Annotated[float, typer.Option("--time-limit", help="Seconds for the whole command (presolve, heuristics, "
                                        "exact search, report); then the best plan with its proven gap.")]
ThreadsOpt = Annotated[int, typer.Option("--threads", help="Solver threads.")]
TargetOpt = Annotated[str, typer.Option("--target", help=" | ".join(TARGET_NAMES) + ".")]  # the target registry
SolverOpt = Annotated[str, typer.Option("--solver", help=" | ".join(("auto", *LISTED)) + ".")]  # the method registry
StagesOpt = Annotated[int | None, typer.Option("--max-stages", help="Upper limit on pipeline stages.")]
GapOpt = Annotated[float, typer.Option("--gap", help="Relative optimality gap to stop at.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.")]


HeadroomOpt = Annotated[str | None, typer.Option("--memory-headroom", help=HEADROOM_HELP)]


def _inputs(model: str, cluster: str, gbs: int, seq: int | None, precision: str, headroom: str | None = None):
    fraction = parse_headroom(headroom)  # flags first: a typo fails before any file is read
    try:
        training = TrainingSpec(global_batch_size=gbs, seq_len=4096 if seq is None else seq, precision=precision,
                                memory_headroom_fraction=fraction)
    except ValidationError as exc:  # -> one paragraph naming the flag
        raise flag_error(exc) from None
    return load_model(model), load_cluster(cluster), training


def _options(solver, time_limit, threads, target, max_stages, gap, seed) -> SolveOptions:
    finite(time_limit, "--time-limit")
    finite(gap, "--gap")
    try:
        return SolveOptions(solver=solver, time_limit_s=time_limit, threads=threads, target=target,
                            max_stages=max_stages, relative_gap=gap, seed=seed)
    except ValidationError as exc:
        raise flag_error(exc) from None


@app.command()
def solve(
    model: ModelOpt = DEFAULT_MODEL,
    cluster: ClusterOpt = DEFAULT_CLUSTER,
    gbs: GbsOpt = 512,
    seq: SeqOpt = None,
    precision: PrecOpt = "bf16",
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
) -> None:
    """Find the plan with the shortest iteration time that fits in memory, with its optimality gap."""
    dl = Deadline.for_command(time_limit)  # --time-limit bounds the whole command; Ctrl-C keeps the best plan
    if json_file is not None and str(json_file) != "-":
        check_output_file(json_file, "--json")
    if plot is not None:
        check_output_dir(plot, "--plot")
    m, c, training = _inputs(model, cluster, gbs, seq, precision, memory_headroom)
    c = apply_network_option(c, network)
    opts = _options(solver, time_limit, threads, target, max_stages, gap, seed)
    out = run_interruptible(lambda: planner.solve(m, c, training, opts, deadline=dl), dl, _stopping)
    doc = solution_document(out.result, m, c, training, plan_metrics(out))
    if json_file is not None and str(json_file) == "-":
        print_json(doc)
    else:
        solve_report(out, console)
        if json_file is not None:
            import json

            write_atomic(json_file, json.dumps(doc, indent=2), flag="--json")
            console.print(f"wrote {json_file}")
    if plot is not None and out.result.plan is not None:
        from haap_milp import plots, simulate

        sim = simulate.simulate_plan(out.result.plan, out.estimator)
        rows = plots.memory_bars(out.result.plan, out.estimate, out.estimator.cluster)
        for path in plots.plot_folder(plot, sim, rows):
            console.print(f"wrote {path}")
    if dl.interrupted:
        _interrupted(out.result)
    if out.result.status.value in ("ERROR",):
        raise SystemExit(1)


def _stopping() -> None:
    err_console.print("stopping: Ctrl-C again to abort without a plan", style="yellow")


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
    gbs: GbsOpt = 512,
    seq: SeqOpt = None,
    precision: PrecOpt = "bf16",
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
) -> None:
    """Run CP-SAT, MILP, the DP heuristic and the uniform Megatron-style baseline on one problem."""
    m, c, training = _inputs(model, cluster, gbs, seq, precision, memory_headroom)
    c = apply_network_option(c, network)
    dl = Deadline.for_command(time_limit)
    opts = _options("auto", time_limit, threads, target, max_stages, gap, seed)
    outs = run_interruptible(lambda: planner.compare(m, c, training, opts, deadline=dl), dl, _stopping)
    if json_out:
        print_json({k: {**plan_metrics(o), "status": o.result.status.value, "bound_s": o.result.bound_s,
                        "gap": o.result.gap, "wall_time_s": o.result.wall_time_s,
                        "plan": o.result.plan.model_dump(mode="json") if o.result.plan else None}
                    for k, o in outs.items()})
    else:
        compare_table(outs, console)
    if dl.interrupted:
        raise SystemExit(130)
