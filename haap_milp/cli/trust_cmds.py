"""`haap-solve simulate` and `haap-solve emit`: parsing and printing only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from haap_milp.cli.common import console, enforce_plan, err_console, print_json
from haap_milp.cli.network_cmd import NetworkOpt
from haap_milp.cli.profile_opts import (
    ProfileDeviceOpt,
    ProfileFallbackOpt,
    ProfileOpt,
    profile_from_flags,
    unmeasured_stages,
    warn_priced_by_fallback,
)
from haap_milp.cli.typer_app import app
from haap_milp.errors import HaapInputError
from haap_milp.outputs import check_output_dir, write_dir_atomic
from haap_milp.targets import ENGINES

PlanArg = Annotated[Path, typer.Argument(help="Plan JSON, or a solve result JSON with a 'plan'.")]
ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Model (default: the one in the plan file).")]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", "-c",
                                                   help="Cluster (default: the one in the plan file).")]


def _inputs(plan_path: Path, model: str | None, cluster: str | None):
    """(plan, model spec, cluster spec, training spec) from the file and the options."""
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.planfile import read_plan_file
    from haap_milp.specs import TrainingSpec

    pf = read_plan_file(plan_path)
    m = load_model(model) if model else pf.model
    c = load_cluster(cluster) if cluster else pf.cluster
    missing = [name for name, val in (("--model", m), ("--cluster", c)) if val is None]
    if missing:
        raise HaapInputError(f"plan file {str(plan_path)!r} does not carry the model and cluster; give "
                             f"{' and '.join(missing)} (a catalog name, a file, or a cluster shorthand)",
                             field=missing[0].lstrip("-"))
    plan = pf.plan
    training = pf.training or TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len,
                                           precision=plan.precision)
    return plan, m, c, training


def _sim_table(sim, estimate) -> Table:
    tab = Table(title=f"{sim.schedule} replay: {sim.num_stages} stages, {sim.num_microbatches} micro-batches"
                      + (f", vpp {sim.vpp}" if sim.vpp > 1 else ""))
    for col in ("stage", "t_j (ms)", "busy", "bubble", "DP sync", "peak in flight", "memory (GiB)"):
        tab.add_column(col, justify="left" if col == "stage" else "right")
    for j in range(sim.num_stages):
        se = estimate.stages[j]
        tab.add_row(sim.stage_labels[j], f"{se.time_s * 1e3:.2f}", f"{sim.busy_fraction[j]:.1%}",
                    f"{sim.bubble_fraction[j]:.1%}", f"{sim.sync_fraction[j]:.1%}", f"{sim.peak_inflight[j]:g}",
                    f"{se.memory_gib:.1f} / {se.capacity_gib:.1f}")
    return tab


@app.command()
def simulate(
    plan: PlanArg,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write timeline and memory plots here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    duplex: Annotated[str, typer.Option("--duplex", help="Links: full (one transfer per direction) or half.")]
    = "full",
    network: NetworkOpt = None,
    profile: ProfileOpt = [],  # noqa: B006
    profile_device: ProfileDeviceOpt = [],  # noqa: B006
    profile_fallback: ProfileFallbackOpt = None,
) -> None:
    """Replay the plan's schedule event by event and compare with the planner's closed form."""
    from haap_milp.estimator import Estimator
    from haap_milp.network.merge import apply_network_option
    from haap_milp.simulate import simulate_plan

    if duplex not in ("full", "half"):
        raise HaapInputError(f"--duplex must be full or half, got {duplex!r}", field="duplex", value=duplex)
    if plot is not None:
        check_output_dir(plot, "--plot")
    if not profile:
        profile_from_flags(profile, profile_device, profile_fallback, None)  # a profile flag alone: exit 2 first
    p, m, c, training = _inputs(plan, model, cluster)
    c = apply_network_option(c, network)
    prof = profile_from_flags(profile, profile_device, profile_fallback, training.precision)
    est = Estimator(m, c, training, profile=prof)
    enforce_plan(p, m, c, training, what=f"plan file {str(plan)!r}", estimator=est)
    estimate = est.estimate(p)
    warn_priced_by_fallback(unmeasured_stages(prof, p))
    sim = simulate_plan(p, est, duplex=duplex)  # type: ignore[arg-type]
    paths = _plots(p, sim, estimate, c, plot) if plot is not None else []
    if json_out:
        print_json({**sim.to_dict(), "estimator_iteration_s": estimate.iteration_time_s,
                    "plots": [str(x) for x in paths]})
        return
    console.print(_sim_table(sim, estimate))
    console.print(f"iteration: simulated {sim.iteration_time_s:.4g} s, planner closed form "
                  f"{estimate.iteration_time_s:.4g} s ({(sim.iteration_time_s / estimate.iteration_time_s - 1):+.2%})")
    for x in paths:
        console.print(f"wrote {x}")


def _plots(plan, sim, estimate, cluster, folder: Path) -> list[Path]:
    from haap_milp.report.plots import memory_bars, plot_folder

    return plot_folder(folder, sim, memory_bars(plan, estimate, cluster))


@app.command()
def emit(
    plan: PlanArg,
    target: Annotated[str, typer.Option("--target", "-t", help=" | ".join(ENGINES) + ".")],
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the files into this folder.")] = None,
    engine_version: Annotated[str | None, typer.Option(
        "--engine-version", help="Older output form of an engine: torchtitan 0.1 (TOML). Default: newest.")] = None,
) -> None:
    """Launch files for a training engine: model definition, arguments/config, rank order (hostfile), NCCL
    settings, and LAUNCH.txt (the command to run and what you must supply: data, tokenizer, checkpoints)."""
    from haap_milp.check import check_plan
    from haap_milp.emit import TARGETS, EmitError
    from haap_milp.emit import emit as emit_files

    if target not in TARGETS:
        raise HaapInputError(f"--target must be one of {', '.join(TARGETS)}, got {target!r}", field="target",
                             value=target)
    if out is not None:
        check_output_dir(out, "--out")
    p, m, c, training = _inputs(plan, model, cluster)
    viol = check_plan(p, m, c, training, target=target, memory=False)
    if viol:  # (each rule points to a target that lacks its gap; the targets that lack them all are said last: a
        # plan with several gaps was sent round in a circle, megatron -> flagscale -> megatron)
        runs = [t for t in TARGETS if t != target and not check_plan(p, m, c, training, target=t, memory=False)]
        tail = (f" It runs on --target {' or '.join(runs)}." if runs else
                f" No target haap emits for runs it as it is: solve again with --target {target}, which keeps the "
                "search to what that engine runs.")
        raise EmitError(f"{target} cannot run this plan: " + "; ".join(str(v) for v in viol) + "." + tail)
    enforce_plan(p, m, c, training, what=f"plan file {str(plan)!r}")  # memory, as solve/simulate/validate
    files = emit_files(p, target, c, m, training, engine_version=engine_version)
    if out is None:
        for name, text in files.items():
            console.print(f"# ===== {name}", markup=False, highlight=False)
            console.print(text, markup=False, highlight=False, soft_wrap=True, end="")
        return
    # all files or none: written in a scratch folder beside --out, then renamed in (outputs.write_dir_atomic)
    modes = {name: 0o755 for name in files if name.endswith(".sh")}
    for path in write_dir_atomic(out, files, flag="--out", modes=modes):
        err_console.print(f"wrote {path}")
    err_console.print(f"\n{out}/LAUNCH.txt:", markup=False, highlight=False)
    err_console.print(files["LAUNCH.txt"], markup=False, highlight=False, soft_wrap=True, end="")
