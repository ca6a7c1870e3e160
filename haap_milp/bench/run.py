"""Running a benchmark grid: one task per (model, cluster, gbs, seq), in worker processes, resumable.

Each task is presolved once (``planner.Context.build``) and its runs go through
``planner.orchestrate``, the sequence ``planner.solve`` and ``planner.compare`` use (heuristics
first, the better warm-starts the exact solvers), so the numbers of all methods of a task
describe the same presolved problem. Every run becomes one CSV row, also
when it fails: an exception is an ERROR row with the message, and a worker process that dies
(segfault, out of memory) is an ERROR row for each run of its task, never a crashed sweep.
"""

from __future__ import annotations

import csv
import logging
import multiprocessing
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path

from haap_milp.bench.spec import BenchSpec, TaskInputs

log = logging.getLogger(__name__)

KEY_COLUMNS = ("model", "cluster", "gbs", "seq", "precision", "method", "time_limit_s")
INFO_COLUMNS = ("model_params_b", "model_layers", "moe", "cluster_gpus", "gpu_types")
RESULT_COLUMNS = ("status", "objective_s", "bound_s", "gap", "wall_s", "presolve_s", "tokens_per_s", "mfu",
                  "compute_bound_ratio", "stages", "num_gpus_used", "message")
COLUMNS = KEY_COLUMNS + INFO_COLUMNS + RESULT_COLUMNS

# generous wall-clock guards inside a worker (the solvers enforce their own limits; these catch hangs)
GUARD_HEURISTIC_S = 900
GUARD_EXACT_SLACK_S = 120


@dataclass(frozen=True)
class Task:
    """One presolve and the runs still to do on it."""

    inputs: TaskInputs
    runs: tuple[tuple[str, float | None], ...]  # (method, time limit or None for heuristics)
    options: tuple[tuple[str, object], ...]  # SolveOptions fields shared by every run


def fmt_limit(limit: float | None) -> str:
    return "" if limit is None else format(float(limit), "g")


def row_key(row: dict) -> tuple[str, ...]:
    """The resume key of a CSV row (all strings, as read back)."""
    return tuple(str(row.get(k, "")) for k in KEY_COLUMNS)


def run_key(inputs: TaskInputs, method: str, limit: float | None) -> tuple[str, ...]:
    return (inputs.model, inputs.cluster, str(inputs.gbs), str(inputs.seq), inputs.precision, method,
            fmt_limit(limit))


def base_row(inputs: TaskInputs, method: str, limit: float | None) -> dict:
    row = dict.fromkeys(COLUMNS, "")
    row.update(model=inputs.model, cluster=inputs.cluster, gbs=inputs.gbs, seq=inputs.seq,
               precision=inputs.precision, method=method, time_limit_s=fmt_limit(limit))
    return row


def error_rows(task: Task, status: str, message: str) -> list[dict]:
    """One row per run of a task that produced nothing (crash, presolve failure)."""
    one_line = " ".join(message.split())[:500]
    return [{**base_row(task.inputs, m, t), "status": status, "message": one_line} for m, t in task.runs]


# --------------------------------------------------------------------------- worker side


class _Guard(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Guard()


def _with_guard(seconds: float, fn: Callable, *args):
    """Run fn with a SIGALRM wall-clock guard (worker processes are single-threaded in Python)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, int(seconds)))
    try:
        return fn(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _info(model, cluster) -> dict:
    return {"model_params_b": round(model.num_params_total / 1e9, 3), "model_layers": model.num_layers,
            "moe": int(model.is_moe), "cluster_gpus": cluster.total_gpus, "gpu_types": len(cluster.gpu_types)}


def _outcome_row(row: dict, out, wall_s: float | None = None) -> dict:
    from haap_milp.report.tables import plan_metrics

    r = out.result
    m = plan_metrics(out)
    plan = r.plan
    row.update(status=r.status.value, objective_s=r.objective_s, bound_s=r.bound_s, gap=r.gap,
               wall_s=round(r.wall_time_s if wall_s is None else wall_s, 4),
               tokens_per_s=m.get("tokens_per_s"), mfu=m.get("mfu"), compute_bound_ratio=m.get("compute_bound_ratio"),
               stages=plan.pp if plan is not None else "", num_gpus_used=plan.num_gpus if plan is not None else "",
               message=" ".join((r.message or "").split())[:500])
    return {k: ("" if v is None else v) for k, v in row.items()}


def run_task(task: Task) -> list[dict]:
    """Presolve once, then every requested run through ``planner.orchestrate`` (heuristics first, the best
    warm-starts the exact runs); one row per run, never raises."""
    from haap_milp import planner
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.network.merge import apply_network_option
    from haap_milp.specs import SolveOptions, TrainingSpec

    logging.getLogger("haap_milp").setLevel(logging.WARNING)
    inp = task.inputs
    limits = [t for _, t in task.runs if t is not None]
    try:
        model, cluster = load_model(inp.model), load_cluster(inp.cluster_ref)
        cluster = apply_network_option(cluster, inp.network, "network")  # None: unchanged
        training = TrainingSpec(global_batch_size=inp.gbs, seq_len=inp.seq, precision=inp.precision)
        opts = SolveOptions(**dict(task.options), time_limit_s=max(limits, default=10.0))
        t0 = time.perf_counter()
        profile = None
        if inp.profile:  # measured profiles of this cluster entry (bench spec 'profile:'), as --profile
            from haap_milp.estimator import load_profiles

            profile = load_profiles(inp.profile, dict(inp.profile_device), inp.precision, inp.profile_fallback or "none")
        ctx = _with_guard(GUARD_HEURISTIC_S, lambda: planner.Context.build(model, cluster, training, opts,
                                                                            profile=profile))
        presolve_s = round(time.perf_counter() - t0, 4)
    except Exception as exc:  # noqa: BLE001 - every failure is a row
        return error_rows(task, "ERROR", _describe(exc, "presolve"))
    info = {**_info(model, cluster), "presolve_s": presolve_s}
    outcomes = planner.orchestrate(ctx, list(task.runs), step=_guarded).outcomes
    rows = []
    for (m, t), out in zip(task.runs, outcomes):
        row = {**base_row(inp, m, t), **info}
        if isinstance(out, Exception):  # every failure is a row
            rows.append({**row, "status": "ERROR", "message": _describe(out, m)})
        else:
            rows.append(_outcome_row(row, out))
    return rows


def _guarded(_method: str, limit: float | None, fn: Callable, *args):
    """One solver call of a run under its wall-clock guard (``planner.orchestrate``'s step)."""
    guard = GUARD_HEURISTIC_S if limit is None else float(limit) + GUARD_EXACT_SLACK_S + 0.5 * float(limit)
    return _with_guard(guard, fn, *args)


def _describe(exc: BaseException, where: str) -> str:
    if isinstance(exc, _Guard):
        return f"{where}: exceeded its wall-clock guard (the solver ignored its time limit)"
    tb = traceback.extract_tb(exc.__traceback__)
    at = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return " ".join(f"{where}: {type(exc).__name__}: {exc}{at}".split())[:500]


# --------------------------------------------------------------------------- driver side


def read_rows(csv_path: Path) -> list[dict]:
    if not csv_path.is_file():
        return []
    with csv_path.open(newline="") as f:
        return list(csv.DictReader(f))


def plan_tasks(spec: BenchSpec, done: set[tuple[str, ...]]) -> tuple[list[Task], int]:
    """Tasks with the runs not yet in ``done``; also the number of runs skipped."""
    tasks, skipped = [], 0
    options = tuple(sorted(spec.solve_options().items()))
    for inputs in spec.tasks():
        runs = []
        for m, t in spec.runs():
            if run_key(inputs, m, t) in done:
                skipped += 1
            else:
                runs.append((m, t))
        if runs:
            tasks.append(Task(inputs, tuple(runs), options))
    return tasks, skipped


def spec_keys(spec: BenchSpec) -> set[tuple[str, ...]]:
    return {run_key(i, m, t) for i in spec.tasks() for m, t in spec.runs()}


class _CsvAppender:
    """Appends rows as they arrive (flushed), so an interrupted sweep resumes where it stopped."""

    def __init__(self, path: Path):
        new = not path.is_file() or path.stat().st_size == 0
        if not new:
            with path.open(newline="") as f:
                header = next(csv.reader(f), [])
            if tuple(header) != COLUMNS:
                raise_header(path, header)
        self._f = path.open("a", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            self._w.writeheader()

    def write(self, rows: Iterable[dict]) -> None:
        self._w.writerows(rows)
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def raise_header(path: Path, header: list[str]) -> None:
    from haap_milp.errors import HaapInputError

    raise HaapInputError(f"{path} has columns {header[:6]}... that are not a haap bench results file of this "
                         "version; use --no-resume to start over or choose another --out folder",
                         field="out", value=str(path))


def execute(tasks: list[Task], workers: int, emit: Callable[[list[dict]], None],
            task_fn: Callable[[Task], list[dict]] = run_task, on_start: Callable[[Task], None] | None = None) -> None:
    """Run tasks in worker processes; every task ends in ``emit(rows)``, whatever happens to its worker."""
    ctx = multiprocessing.get_context("spawn")  # no fork: the driver has threads (progress bar)
    pending, suspects = deque(tasks), []
    while pending:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            inflight: dict = {}
            while pending or inflight:
                while pending and len(inflight) < workers:
                    t = pending.popleft()
                    if on_start:
                        on_start(t)
                    inflight[pool.submit(task_fn, t)] = t
                finished, _ = wait(inflight, return_when=FIRST_COMPLETED)
                broken = False
                for fut in finished:
                    t = inflight.pop(fut)
                    try:
                        emit(fut.result())
                    except BrokenProcessPool:
                        suspects.append(t)
                        broken = True
                    except Exception as exc:  # noqa: BLE001 - e.g. a task_fn that raised
                        emit(error_rows(t, "ERROR", _describe(exc, "worker")))
                if broken:  # the pool is unusable: every task in flight is a suspect
                    suspects.extend(inflight.values())
                    break
    for t in suspects:  # rerun each suspect alone, so a crash is pinned on the task that causes it
        _isolated(t, ctx, emit, task_fn)


def _isolated(task: Task, ctx, emit, task_fn) -> None:
    """Run one task alone; if its worker dies, split it into one task per run so only the culprit fails."""
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        try:
            emit(pool.submit(task_fn, task).result())
            return
        except BrokenProcessPool:
            crashed = True
        except Exception as exc:  # noqa: BLE001
            emit(error_rows(task, "ERROR", _describe(exc, "worker")))
            return
    if crashed and len(task.runs) > 1:
        log.warning("worker died on %s on %s; rerunning its runs one by one", task.inputs.model, task.inputs.cluster)
        for run in task.runs:
            _isolated(replace(task, runs=(run,)), ctx, emit, task_fn)
    else:
        method = task.runs[0][0] if task.runs else "?"
        emit(error_rows(task, "ERROR", f"{method}: worker process died (crash or out of memory) during this run; "
                                       "its presolve and the other methods of the task ran in separate processes"))


@dataclass
class BenchRun:
    """What a sweep did and where it wrote."""

    out_dir: Path
    runs_total: int
    runs_done: int
    runs_skipped: int
    wall_s: float
    files: list[Path]


def run_bench(spec: BenchSpec, out_dir: Path, workers: int = 1, resume: bool = True,
              progress: Callable[[int, int, str], None] | None = None,
              task_fn: Callable[[Task], list[dict]] = run_task) -> BenchRun:
    """Run the grid into ``out_dir`` (results.csv, summary.md, PNG plots); returns counts and files.

    ``progress(done_runs, total_runs, note)`` is called as tasks start and finish.
    """
    from haap_milp.bench.report import write_report

    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "results.csv"
    if not resume and csv_path.exists():
        csv_path.unlink()
    done = {row_key(r) for r in read_rows(csv_path)}
    tasks, skipped = plan_tasks(spec, done)
    total = sum(len(t.runs) for t in tasks)
    count = [0]

    def emit(rows: list[dict]) -> None:
        writer.write(rows)
        count[0] += len(rows)
        if progress:
            progress(count[0], total, f"{rows[0]['model']} on {rows[0]['cluster']}" if rows else "")

    def started(t: Task) -> None:
        if progress:
            progress(count[0], total, f"{t.inputs.model} on {t.inputs.cluster}")

    writer = _CsvAppender(csv_path)
    try:
        if tasks:
            execute(tasks, max(1, workers), emit, task_fn=task_fn, on_start=started)
    finally:
        writer.close()
    keys = spec_keys(spec)
    rows = [r for r in read_rows(csv_path) if row_key(r) in keys]
    files = [csv_path] + write_report(spec, rows, out_dir)
    return BenchRun(out_dir, total + skipped, count[0], skipped, time.perf_counter() - t0, files)
