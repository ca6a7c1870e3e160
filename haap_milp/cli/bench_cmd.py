"""`haap-solve bench`: run a benchmark grid (parsing and printing only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from haap_milp.cli.app import app
from haap_milp.cli.common import console, fail


@app.command()
def bench(
    spec_file: Annotated[Path | None, typer.Argument(
        metavar="[SPEC.yaml]", help="Benchmark spec (default: the built-in default grid).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder (default: bench-<spec name>).")] = None,
    workers: Annotated[int, typer.Option("--workers", "-j", help="Worker processes (one task each).")] = 2,
    no_resume: Annotated[bool, typer.Option("--no-resume", help="Start over instead of skipping finished runs.")] = False,
) -> None:
    """Run models x clusters x methods x time limits; write results.csv, summary.md and PNG plots."""
    from haap_milp.bench.run import run_bench
    from haap_milp.bench.spec import default_spec, load_spec

    if workers < 1:
        fail(f"--workers must be at least 1, got {workers}")
    spec = load_spec(spec_file) if spec_file is not None else default_spec()
    out_dir = out or Path(f"bench-{spec.name}")
    from haap_milp.outputs import check_output_dir

    check_output_dir(out_dir, "--out")  # before any run
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"))
    with Progress(*cols, console=console, transient=False) as bar:
        job = bar.add_task(f"bench {spec.name}", total=None, note="presolving")

        def progress(done: int, total: int, note: str) -> None:
            bar.update(job, completed=done, total=total, note=note)

        result = run_bench(spec, out_dir, workers=workers, resume=not no_resume, progress=progress)
    console.print(f"{result.runs_done} runs done, {result.runs_skipped} skipped (already in results.csv), "
                  f"{result.wall_s:.1f} s wall", highlight=False)
    for path in result.files:
        console.print(f"wrote {path}", highlight=False)
