"""`haap-solve pareto` (time vs cost or energy) and `haap-solve replan` (after GPUs are lost or added)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from haap_milp import planner
from haap_milp.catalog import DEFAULT_CLUSTER, DEFAULT_MODEL
from haap_milp.cli.common import console, enforce_plan, err_console, finite, print_json
from haap_milp.cli.economics_opts import (
    MaxCostOpt,
    MaxPointsOpt,
    MaxTimeOpt,
    MinTpsOpt,
    PriceKindOpt,
    PricesOpt,
    StepOpt,
    price_book,
)
from haap_milp.cli.network_cmd import NetworkOpt
from haap_milp.cli.solve_cmds import (
    ClusterOpt,
    GapOpt,
    GbsOpt,
    HeadroomOpt,
    ModelOpt,
    PrecOpt,
    SeqOpt,
    StagesOpt,
    TargetOpt,
    ThreadsOpt,
    TimeOpt,
    _inputs,
    _options,
    _stopping,
)
from haap_milp.cli.typer_app import app
from haap_milp.deadline import Deadline, run_interruptible, use
from haap_milp.errors import HaapInputError
from haap_milp.network.merge import apply_network_option
from haap_milp.outputs import check_output_dir

MeasureOpt = Annotated[str, typer.Option("--measure", help="cost | energy: the second axis of the frontier.")]


@app.command()
def pareto(
    model: ModelOpt = DEFAULT_MODEL,
    cluster: ClusterOpt = DEFAULT_CLUSTER,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    precision: PrecOpt = None,
    measure: MeasureOpt = "cost",
    max_points: MaxPointsOpt = 8,
    step: StepOpt = 0.05,
    max_cost_per_hour: MaxCostOpt = None,
    min_tokens_per_s: MinTpsOpt = None,
    max_iteration_time: MaxTimeOpt = None,
    prices: PricesOpt = None,
    price: PriceKindOpt = "on_demand",
    time_limit: TimeOpt = 120.0,
    threads: ThreadsOpt = 2,
    target: TargetOpt = "any",
    max_stages: StagesOpt = None,
    gap: GapOpt = 0.01,
    network: NetworkOpt = None,
    memory_headroom: HeadroomOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the points as a JSON list to stdout.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write pareto.png/svg to this folder.")] = None,
) -> None:
    """Time vs cost (or energy) frontier: each point the fastest plan whose GPUs cost (draw) less than the last."""
    from haap_milp import frontier
    from haap_milp.cli.economics_opts import goal_from_flags

    if measure not in ("cost", "energy"):
        raise HaapInputError(f"--measure {measure!r}: choose cost or energy", field="--measure", value=measure)
    if plot is not None:
        check_output_dir(plot, "--plot")
    dl = Deadline.for_command(time_limit)
    m, c, training = _inputs(model, cluster, gbs, seq, precision, memory_headroom)
    c = apply_network_option(c, network)
    opts = _options("auto", time_limit, threads, target, max_stages, gap, 0)
    goal = goal_from_flags("time", max_cost_per_hour, min_tokens_per_s, max_iteration_time, None,
                           training.global_batch_size * training.seq_len, max_points, step)
    if measure == "energy" and max_cost_per_hour is not None:
        raise HaapInputError("--max-cost-per-hour with --measure energy: one budget row at a time (eq. W1)",
                             field="--max-cost-per-hour")
    book = price_book(prices, price, c)

    def sweep():
        with use(dl):
            ctx = planner.Context.build(m, c, training, opts)
        return frontier.sweep(ctx, book, measure, max_points=max_points, cap=goal.max_usd_per_hour,
                              max_time_s=goal.max_iteration_time_s, step=step, deadline=dl)

    # Ctrl-C keeps the points found so far (the step running returns its best plan), as solve keeps its plan
    fr = run_interruptible(sweep, dl, _stopping)
    docs = [frontier.point_document(p, book) for p in fr.pareto]
    if as_json:
        print_json(docs)
        if fr.infeasible:  # stdout stays the JSON list; why it is empty goes to stderr
            err_console.print(f"no plan at any budget: {fr.infeasible}", markup=False, highlight=False)
    else:
        _pareto_table(fr, docs, measure)
    if plot is not None and docs:
        from haap_milp.report.plots import pareto_folder

        for path in pareto_folder(plot, docs, measure):
            (err_console if as_json else console).print(f"wrote {path}")  # stdout stays JSON
    if dl.interrupted:  # after Ctrl-C: one line on what was kept, exit 130 (as solve)
        kept = f"{len(docs)} frontier point(s) found so far; the frontier is incomplete" if docs else \
            "no frontier point found yet"
        err_console.print(f"interrupted: {kept}", style="yellow")
        raise SystemExit(130)


def _pareto_table(fr, docs: list[dict], measure: str) -> None:
    t = Table(title=f"time vs {measure}: the fastest plan under each budget (eqs. F1-F3)")
    for col in ("iteration s", "gap", "tokens/s", "$/h", "$/iteration", "$/1M tokens", "J/token", "GPUs used"):
        t.add_column(col, justify="left" if col == "GPUs used" else "right")

    def f(x, spec):
        return "-" if x is None else format(x, spec)
    for d in docs:
        t.add_row(f(d["iteration_time_s"], ".3f"), f(d["gap"], ".2%"), f(d["tokens_per_s"], ",.0f"),
                  f(d["usd_per_hour"], ",.2f"), f(d["usd_per_iteration"], ".4g"), f(d["usd_per_million_tokens"], ".4g"),
                  f(d["joules_per_token"], ".4g"), ", ".join(f"{n} {k}" for k, n in d["gpus"].items()))
    Console(width=max(console.width, 120), highlight=False).print(t)  # wide table even when piped
    Console(width=max(console.width, 120), highlight=False).print(pareto_summary(fr, docs, measure), markup=False)


def pareto_summary(fr, docs: list[dict], measure: str) -> str:
    """What the sweep proved: each point's time within its gap under its budget (eq. W1); the least cost (energy)
    of every plan only when the frontier is complete (eq. F2). Stopped early, eq. F3's bound (L_K R_floor) is
    far below any plan (the cheapest plans lie many points away: 95 % gap on the README's example), so it is
    not stated as the cost optimum's bound; ``solve --objective cost|energy`` proves that (eqs. EB1-EB5)."""
    unit = "$ per iteration" if measure == "cost" else "J per iteration"
    best = fr.best
    gaps = [d["gap"] for d in docs if d["gap"] is not None]
    proven = "-" if not gaps else f"{max(gaps):.2%}"
    head = (f"{len(fr.points)} solve(s), {len(docs)} frontier point(s), each the fastest plan under its budget, "
            f"proven within {proven} (the largest point gap)")
    least = "-" if best is None else format(best.value, ".4g")
    if fr.infeasible:  # proven: no plan at any budget; the binding limit as the time objective states it
        return f"{head}; no plan at any budget: {fr.infeasible}"
    if fr.complete and not fr.points:
        return f"{head}; no plan ({fr.stopped})"
    if fr.complete and fr.lower_bound is not None:
        gap = "-" if fr.gap is None else f"{fr.gap:.2%}"
        return (f"{head}; frontier complete ({fr.stopped}): least {unit} {least}, proven bound "
                f"{fr.lower_bound:.4g} (eq. F2), gap {gap}")
    return (f"{head}; frontier incomplete ({fr.stopped}): cheaper plans may lie past the last budget; least {unit} "
            f"of these points {least} (the {measure} optimum: solve --objective {measure})")


@app.command()
def replan(
    plan_file: Annotated[str, typer.Argument(help="The plan that was running (`solve --json` output).")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="The cluster as it is now (catalog, YAML, "
                                         "shorthand).")],
    max_migration: Annotated[float | None, typer.Option(
        "--max-migration", help="Seconds the state move may take; a longer one keeps the degraded plan.")] = None,
    time_limit: TimeOpt = 8.0,  # replan.DEFAULT_TIME_LIMIT_S: with start-up the command ends within 10 s
    threads: ThreadsOpt = 2,
    target: TargetOpt = "any",
    gap: GapOpt = 0.01,
    prices: PricesOpt = None,
    price: PriceKindOpt = "on_demand",
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the result JSON here ('-' = stdout).")] = None,
) -> None:
    """Best plan on the changed cluster, the cost of moving to it and when it pays back against staying degraded."""
    from haap_milp import replan as rp
    from haap_milp.catalog import load_cluster
    from haap_milp.outputs import check_output_file
    from haap_milp.planfile import read_plan_file, solution_document
    from haap_milp.presolve import presolve_document
    from haap_milp.report.tables import plan_metrics, solve_report

    if json_file is not None and str(json_file) != "-":
        check_output_file(json_file, "--json")
    if max_migration is not None:
        finite(max_migration, "--max-migration", lo=0)
    dl = Deadline.for_command(time_limit)
    pf = read_plan_file(plan_file)
    if pf.model is None:
        raise HaapInputError(f"plan file {plan_file!r} does not hold its model; replan needs the `solve --json` "
                             "output (model, cluster and training inside)", field="plan")
    from haap_milp.specs import TrainingSpec

    training = pf.training or TrainingSpec(global_batch_size=pf.plan.global_batch_size, seq_len=pf.plan.seq_len,
                                           precision=pf.plan.precision)
    if pf.cluster is not None:  # the checker's rules on the plan that was running, as `validate` runs them (not its
        # memory: a plan solved on measured profiles is priced by them, which the file does not carry)
        enforce_plan(pf.plan, pf.model, pf.cluster, training, what=f"plan in {plan_file!r}", memory=False)
    new_cluster = load_cluster(cluster)
    opts = _options("auto", time_limit, threads, target, None, gap, 0)
    book = price_book(prices, price, new_cluster)
    r = rp.replan(pf.plan, pf.model, training, new_cluster, opts, book, max_migration, deadline=dl)
    block = replan_document(r)
    doc = solution_document(r.new.result, pf.model, new_cluster, training, {**plan_metrics(r.new, book),
                            "replan": block}, presolve_document(r.new.presolved))
    if json_file is not None and str(json_file) == "-":
        print_json(doc)
        return
    solve_report(r.new, console, book)
    console.print("\n".join(replan_lines(block)), highlight=False, markup=False)
    if json_file is not None:
        import json

        from haap_milp.outputs import write_atomic

        write_atomic(json_file, json.dumps(doc, indent=2), flag="--json")
        console.print(f"wrote {json_file}")


def replan_document(r) -> dict:
    m = r.migration
    return {"choice": r.choice, "note": r.note, "new_iteration_time_s": None if r.new.estimate is None
            else r.new.estimate.iteration_time_s, "degraded_iteration_time_s": r.degraded_time_s,
            "must_migrate": r.degraded is None, "migration_time_s": None if m is None else m.time_s,
            "migration_usd": None if m is None else m.usd, "migration_bytes": None if m is None else m.bytes_moved,
            "migration_pairs": None if m is None else m.pairs,
            "layers_from_checkpoint": None if m is None else m.from_checkpoint, "payback_s": r.payback_s,
            "degraded_plan": None if r.degraded is None else r.degraded.model_dump(mode="json")}


def replan_lines(b: dict) -> list[str]:
    def f(x, spec, unit=""):
        return "-" if x is None else format(x, spec) + unit
    deg = "cannot run (must migrate)" if b["must_migrate"] else f(b["degraded_iteration_time_s"], ".3f", " s")
    lines = [f"degraded    old plan minus the lost GPUs: {deg}",
             (f"migration   {f(b['migration_bytes'] and b['migration_bytes'] / 1e9, ',.1f', ' GB')} of weights + "
              f"optimizer state in {f(b['migration_time_s'], '.2f', ' s')}, ${f(b['migration_usd'], '.4g')}"),
             (f"payback     {f(b['payback_s'], ',.1f', ' s of wall time') if b['payback_s'] is not None else 'never'}"
              f"   choice: {b['choice']}" + (f" ({b['note']})" if b["note"] else ""))]
    if b.get("layers_from_checkpoint"):
        lines.append(f"checkpoint  layers {b['layers_from_checkpoint']} had no GPU left: restore them from a checkpoint")
    return lines
