"""`haap-solve bench`: run a benchmark grid (parsing and printing only)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from haap_milp.cli.common import console, err_console, fail
from haap_milp.cli.typer_app import app

#: built-in specs, by the name given instead of a file (``haap-solve bench default``)
MAX_WORKERS = 256  # worker processes; more than any machine this runs on has cores (and a C int)
BUILTIN_SPECS = {"default": "the full grid: 7 models x 7 clusters x cpsat, milp, dp, uniform at 10 s and 30 s "
                            "(about 18 minutes with --workers 2)"}


def _no_spec() -> str:
    names = "; ".join(f"'{k}' ({v})" for k, v in BUILTIN_SPECS.items())
    return ("SPEC.yaml: give a benchmark spec file or a built-in spec name; built-in specs: " + names +
            ". Run the full grid with `haap-solve bench default`; a quick grid (a few minutes) is "
            "`haap-solve bench benchmarks/specs/quick.yaml`.")


@app.command()
def bench(
    spec_file: Annotated[str | None, typer.Argument(
        metavar="SPEC.yaml", show_default=False,
        help="Benchmark spec file, or 'default' for the built-in full grid (about 18 min with 2 workers). "
             "Required: without it bench lists the built-in specs and exits 2.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder (default: bench-<spec name>); "
                                             "locked while a bench writes into it.")] = None,
    workers: Annotated[int, typer.Option("--workers", "-j", help="Worker processes (one task each).")] = 2,
    no_resume: Annotated[bool, typer.Option("--no-resume", help="Start over instead of skipping finished runs.")] = False,
) -> None:
    """Run models x clusters x methods x time limits; write results.csv, summary.md and PNG plots.

    Resumable: finished runs are skipped, rows cut short by an interruption are dropped and rerun.
    Ctrl-C / SIGTERM stop the workers, keep the finished rows and print the command that resumes
    (exit 130 / 143). The progress line shows an estimate of the time left.
    """
    from haap_milp.bench.run import BenchInterrupted, run_bench
    from haap_milp.bench.spec import default_spec, load_spec

    if spec_file is None:
        fail(_no_spec())
    if not 1 <= workers <= MAX_WORKERS:
        fail(f"--workers must be between 1 and {MAX_WORKERS}, got {workers}")
    if spec_file in BUILTIN_SPECS and not Path(spec_file).exists():
        spec = default_spec()
    else:
        spec = load_spec(spec_file)
    out_dir = out or Path(f"bench-{spec.name}")
    from haap_milp.outputs import check_output_dir

    check_output_dir(out_dir, "--out")  # before any run
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"))
    resume_cmd = " ".join(["haap-solve", "bench", shlex.quote(spec_file), "--out", shlex.quote(str(out_dir)),
                           "--workers", str(workers)])
    try:
        with Progress(*cols, console=console, transient=False) as bar:
            job = bar.add_task(f"bench {spec.name}", total=None, note="starting")

            def progress(done: int, total: int, note: str) -> None:
                bar.update(job, completed=done, total=total, note=note)

            result = run_bench(spec, out_dir, workers=workers, resume=not no_resume, progress=progress)
    except BenchInterrupted as stop:
        err_console.print(f"interrupted by {stop}: the workers were stopped; {stop.runs_done} runs of this session are "
                          f"saved in {stop.csv_path}, {stop.runs_left} were not finished. Resume with:\n"
                          f"  {resume_cmd}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(stop.exit_code) from None
    for note in result.repaired:
        console.print(f"results.csv: {note}; dropped and run again", highlight=False)
    console.print(f"{result.runs_done} runs done, {result.runs_skipped} skipped (already in results.csv), "
                  f"{result.wall_s:.1f} s wall", highlight=False)
    for path in result.files:
        console.print(f"wrote {path}", highlight=False)
