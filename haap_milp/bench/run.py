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
import io
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path

from haap_milp.bench.spec import BenchSpec, TaskInputs

log = logging.getLogger(__name__)

KEY_COLUMNS = ("model", "cluster", "gbs", "seq", "precision", "method", "time_limit_s")
INFO_COLUMNS = ("model_params_b", "model_layers", "moe", "cluster_gpus", "gpu_types")
RESULT_COLUMNS = ("status", "objective_s", "bound_s", "gap", "wall_s", "presolve_s", "tokens_per_s", "mfu",
                  "compute_bound_ratio", "stages", "num_gpus_used", "usd_per_iteration", "usd_per_million_tokens",
                  "joules_per_token", "message")
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

#: Tests only, comma-separated: ``sleep=SECONDS`` makes each task sleep first (``sleep_on=PREFIX``: only tasks on
#: clusters whose label starts with PREFIX), slow tasks for the signal tests; ``started=DIR`` makes each task create
#: ``DIR/<worker pid>-<ns>`` when it starts; ``fail=LABEL`` makes every solver call on the cluster labelled LABEL raise
#: (ERROR rows from a solver failure).
TEST_HOOK_ENV = "HAAP_BENCH_TEST_HOOK"
WATCH_PARENT_S = 0.5  # how often a worker checks that the driver is still its parent


def _test_hook() -> dict[str, str]:
    text = os.environ.get(TEST_HOOK_ENV, "")
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def worker_init(driver_pid: int) -> None:
    """Pool initializer: a worker dies with the driver, however the driver ends.

    On Linux the kernel sends SIGKILL when the parent dies (``PR_SET_PDEATHSIG``); a watchdog thread also
    checks that the parent is still ``driver_pid`` (covers a driver that died before the prctl, and other
    systems). SIGINT is ignored: a Ctrl-C reaches the whole foreground group, and the driver decides (it stops
    the workers, saves what is finished and says how to resume)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl: the watchdog still works
            pass
    if os.getppid() != driver_pid:  # the driver died before the prctl took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(driver_pid,), name="haap-parent-watch", daemon=True).start()


def _watch_parent(driver_pid: int) -> None:
    while os.getppid() == driver_pid:
        time.sleep(WATCH_PARENT_S)
    os.kill(os.getpid(), signal.SIGKILL)



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
               usd_per_iteration=m.get("usd_per_iteration"), usd_per_million_tokens=m.get("usd_per_million_tokens"),
               joules_per_token=m.get("joules_per_token"),  # eqs. E2, E5 at the catalog's on-demand prices
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
    hook = _test_hook()
    if "started" in hook:
        Path(hook["started"], f"{os.getpid()}-{time.monotonic_ns()}").touch()
    if "sleep" in hook and inp.cluster.startswith(hook.get("sleep_on", "")):
        time.sleep(float(hook["sleep"]))
    step = _injected_failure if hook.get("fail") == inp.cluster else _guarded
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
    outcomes = planner.orchestrate(ctx, list(task.runs), step=step).outcomes
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


def _injected_failure(method: str, _limit, _fn, *_args):
    raise RuntimeError(f"injected solver failure in {method} ({TEST_HOOK_ENV}, tests only)")


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


def repair_csv(path: Path) -> list[str]:
    """Drop rows an interrupted write left incomplete (a last line without its line end, a row with the wrong
    number of columns, a repeated header); the file is rewritten atomically, and the dropped runs are not
    finished, so they run again. Returns one note per dropped row (none for a sound file, left untouched)."""
    from haap_milp.outputs import write_atomic

    if not path.is_file():
        return []
    data = path.read_bytes()
    if not data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
    if "\n" not in text and (",".join(COLUMNS) + "\r").startswith(text):  # killed while writing the header
        write_atomic(path, b"", flag="--out")
        return ["the header was cut short"]
    parts = text.split("\n")  # rows end in \r\n; only \n splits (a message may hold other line breaks)
    lines = [x + "\n" for x in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    header = next(csv.reader(lines[:1]), [])
    if tuple(header) != COLUMNS:
        raise_header(path, header)
    kept, notes = [lines[0]], []
    for n, line in enumerate(lines[1:], start=2):
        fields = next(csv.reader([line]), [])
        if not line.endswith("\n"):
            notes.append(f"line {n} was cut short (no line end: the write was interrupted)")
        elif tuple(fields) == COLUMNS:
            notes.append(f"line {n} repeats the header")
        elif len(fields) != len(COLUMNS):
            notes.append(f"line {n} has {len(fields)} columns instead of {len(COLUMNS)}")
        else:
            kept.append(line)
    if notes:
        write_atomic(path, "".join(kept).encode("utf-8"), flag="--out")
    return notes


class _CsvAppender:
    """Appends each task's rows whole (one write, flushed and fsync-ed), so an interrupted sweep resumes where
    it stopped and a row is either complete on disk or detected as torn (``repair_csv``)."""

    def __init__(self, path: Path):
        new = not path.is_file() or path.stat().st_size == 0
        if not new:
            with path.open(newline="") as f:
                header = next(csv.reader(f), [])
            if tuple(header) != COLUMNS:
                raise_header(path, header)
        self._f = path.open("a", newline="")
        if new:
            self._put([dict(zip(COLUMNS, COLUMNS))])

    def _put(self, rows: Iterable[dict]) -> None:
        buf = io.StringIO(newline="")
        csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore").writerows(rows)
        self._f.write(buf.getvalue())
        self._f.flush()
        os.fsync(self._f.fileno())

    def write(self, rows: Iterable[dict]) -> None:
        self._put(rows)

    def close(self) -> None:
        self._f.close()


def raise_header(path: Path, header: list[str]) -> None:
    from haap_milp.errors import HaapInputError

    raise HaapInputError(f"{path} has columns {header[:6]}... that are not a haap bench results file of this "
                         "version; use --no-resume to start over or choose another --out folder",
                         field="out", value=str(path))


# --------------------------------------------------------------------------- lock, signals, ETA

LOCK_NAME = ".bench.lock"


def lock_output(out_dir: Path):
    """An exclusive lock on ``<out>/.bench.lock`` for the whole sweep (two runs into one folder would interleave
    their rows); the file holds the owner's pid. Returns the open file (the lock goes with it, also when the
    process is killed); a folder already locked is a HaapInputError naming the folder and the holder's pid."""
    from haap_milp.errors import HaapInputError

    path = out_dir / LOCK_NAME
    f = path.open("a+")
    try:
        import fcntl

        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # pragma: no cover - no fcntl (Windows): no lock
        return f
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise HaapInputError(f"--out {str(out_dir)!r}: another haap-solve bench (pid {holder}) is writing into this "
                             "folder; wait for it to finish, stop it, or choose another --out folder",
                             field="out", value=str(out_dir)) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class BenchInterrupted(Exception):
    """The sweep was stopped by a signal; finished rows are saved, the workers are gone."""

    def __init__(self, signum: int, runs_done: int, runs_left: int, csv_path: Path):
        self.signum, self.runs_done, self.runs_left, self.csv_path = signum, runs_done, runs_left, csv_path
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _Signals:
    """SIGINT, SIGTERM and SIGHUP set a flag the driver loop polls (never an exception in the middle of a CSV
    write); installed only in the main thread, the previous handlers restored on exit."""

    CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.signum: int | None = None
        self._old: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.CAUGHT:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, _frame):
        if self.signum is None:
            self.signum = signum

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)

    def __call__(self) -> int | None:
        return self.signum


class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


class Eta:
    """Time left, estimated from the durations of the tasks finished so far (mean per kind of task: the same
    methods and time limits), spread over the workers. ``None`` until a task has finished."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        self._durations: dict[tuple, list[float]] = {}
        self._started: dict[int, tuple[tuple, float]] = {}
        self._pending: dict[tuple, int] = {}

    @staticmethod
    def kind(task: Task) -> tuple:
        return task.runs

    def plan(self, tasks: list[Task]) -> None:
        for t in tasks:
            self._pending[self.kind(t)] = self._pending.get(self.kind(t), 0) + 1

    def start(self, task: Task) -> None:
        k = self.kind(task)
        self._pending[k] = max(0, self._pending.get(k, 0) - 1)
        self._started[id(task)] = (k, time.monotonic())

    def finish(self, task: Task) -> None:
        k, t0 = self._started.pop(id(task), (self.kind(task), None))
        if t0 is not None:
            self._durations.setdefault(k, []).append(time.monotonic() - t0)

    def _mean(self, k: tuple) -> float | None:
        d = self._durations.get(k)
        if d:
            return sum(d) / len(d)
        every = [x for v in self._durations.values() for x in v]
        return sum(every) / len(every) if every else None

    def seconds_left(self) -> float | None:
        if not self._durations:
            return None
        now = time.monotonic()
        work = sum(n * self._mean(k) for k, n in self._pending.items())
        work += sum(max(0.0, self._mean(k) - (now - t0)) for k, t0 in self._started.values())
        return work / min(self.workers, max(1, len(self._started) + sum(self._pending.values())))


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "time left: estimate after the first task"
    s = round(seconds)
    text = f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")
    return f"~{text} left (estimate)"


# --------------------------------------------------------------------------- the pool


def _pool(workers: int, ctx) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=worker_init,
                               initargs=(os.getpid(),))


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """End every worker of the pool now (SIGTERM, then SIGKILL after 2 s) and reap them."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # (read now: ``shutdown`` sets it to None)
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)
    pool.shutdown(wait=False, cancel_futures=True)
    # the pool's manager thread closes its wake-up pipe as it ends; CPython 3.11's exit hook (concurrent.futures.process.
    # _python_exit) writes to that pipe if it still looks open, and a close in between printed "OSError: [Errno 9] Bad
    # file descriptor" with a traceback after "interrupted by SIGTERM" (seen once in CI). Joined here, the thread has
    # closed it before the hook runs (the workers are gone, so it ends at once). The thread must be taken before
    # ``shutdown``, which drops the pool's reference to it: read after, as until 2026-12-06, it was always None, the
    # join never ran, and the traceback came back in CI (test_bench_signals, SIGTERM)
    if manager is not None:
        manager.join(2.0)


def _wait(fs, should_stop: Callable[[], int | None]):
    """``wait(FIRST_COMPLETED)`` that notices a stop request within a fifth of a second."""
    while True:
        signum = should_stop()
        if signum is not None:
            raise _Stop(signum)
        finished, _ = wait(fs, timeout=0.2, return_when=FIRST_COMPLETED)
        if finished:
            return finished


def _never() -> None:
    return None


def execute(tasks: list[Task], workers: int, emit: Callable[[list[dict]], None],
            task_fn: Callable[[Task], list[dict]] = run_task, on_start: Callable[[Task], None] | None = None,
            should_stop: Callable[[], int | None] = _never,
            on_finish: Callable[[Task], None] | None = None) -> None:
    """Run tasks in worker processes; every task ends in ``emit(rows)``, whatever happens to its worker.

    When ``should_stop()`` returns a signal number, no task is started any more, the workers are ended and
    ``_Stop`` is raised (the rows emitted so far are complete)."""
    ctx = multiprocessing.get_context("spawn")  # no fork: the driver has threads (progress bar)
    pending, suspects = deque(tasks), []

    def done(t: Task, rows: list[dict]) -> None:
        if on_finish:
            on_finish(t)
        emit(rows)

    while pending:
        pool = _pool(workers, ctx)
        try:
            inflight: dict = {}
            while pending or inflight:
                if (signum := should_stop()) is not None:
                    raise _Stop(signum)
                broken = False
                while pending and len(inflight) < workers:
                    t = pending[0]
                    try:
                        fut = pool.submit(task_fn, t)
                    except BrokenProcessPool:  # a worker died since the last wait: this task was not started
                        broken = True
                        break
                    pending.popleft()
                    if on_start:
                        on_start(t)
                    inflight[fut] = t
                finished = _wait(inflight, should_stop) if inflight and not broken else set()
                for fut in finished:
                    t = inflight.pop(fut)
                    try:
                        done(t, fut.result())
                    except BrokenProcessPool:
                        suspects.append(t)
                        broken = True
                    except Exception as exc:  # noqa: BLE001 - e.g. a task_fn that raised
                        done(t, error_rows(t, "ERROR", _describe(exc, "worker")))
                if broken:  # the pool is unusable: every task in flight is a suspect
                    suspects.extend(inflight.values())
                    break
        except BaseException:
            _stop_pool(pool)
            raise
        pool.shutdown(wait=True)
    for t in suspects:  # rerun each suspect alone, so a crash is pinned on the task that causes it
        _isolated(t, ctx, lambda rows, t=t: done(t, rows), task_fn, should_stop)


def _isolated(task: Task, ctx, emit, task_fn, should_stop=_never) -> None:
    """Run one task alone; if its worker dies, split it into one task per run so only the culprit fails."""
    pool = _pool(1, ctx)
    crashed = False
    try:
        fut = pool.submit(task_fn, task)
        _wait([fut], should_stop)
        try:
            rows = fut.result()
        except BrokenProcessPool:
            crashed = True
        except Exception as exc:  # noqa: BLE001
            rows = error_rows(task, "ERROR", _describe(exc, "worker"))
    except BaseException:
        _stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    if not crashed:
        emit(rows)
    elif len(task.runs) > 1:
        log.warning("worker died on %s on %s; rerunning its runs one by one", task.inputs.model, task.inputs.cluster)
        for run in task.runs:
            _isolated(replace(task, runs=(run,)), ctx, emit, task_fn, should_stop)
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
    repaired: list[str] = field(default_factory=list)  # rows of results.csv dropped as torn (rerun)


def run_bench(spec: BenchSpec, out_dir: Path, workers: int = 1, resume: bool = True,
              progress: Callable[[int, int, str], None] | None = None,
              task_fn: Callable[[Task], list[dict]] = run_task) -> BenchRun:
    """Run the grid into ``out_dir`` (results.csv, summary.md, PNG plots); returns counts and files.

    ``progress(done_runs, total_runs, note)`` is called as tasks start and finish; the note ends with the
    estimated time left. The folder is locked for the whole sweep. SIGINT/SIGTERM/SIGHUP stop it: the workers
    are ended, the finished rows stay in results.csv and ``BenchInterrupted`` is raised.
    """
    from haap_milp.bench.report import write_report

    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_output(out_dir)
    try:
        csv_path = out_dir / "results.csv"
        if not resume and csv_path.exists():
            csv_path.unlink()
        repaired = repair_csv(csv_path)
        done = {row_key(r) for r in read_rows(csv_path)}
        tasks, skipped = plan_tasks(spec, done)
        total = sum(len(t.runs) for t in tasks)
        count = [0]
        eta = Eta(workers)
        eta.plan(tasks)
        note = [""]

        def tell() -> None:
            if progress:
                busy = note[0] and count[0] < total
                progress(count[0], total, f"{note[0]} · {fmt_eta(eta.seconds_left())}" if busy else note[0])

        def emit(rows: list[dict]) -> None:
            writer.write(rows)
            count[0] += len(rows)
            note[0] = f"{rows[0]['model']} on {rows[0]['cluster']}" if rows else ""
            tell()

        def started(t: Task) -> None:
            eta.start(t)
            note[0] = f"{t.inputs.model} on {t.inputs.cluster}"
            tell()

        writer = _CsvAppender(csv_path)
        try:
            with _Signals() as signals:
                if tasks:
                    try:
                        execute(tasks, max(1, workers), emit, task_fn=task_fn, on_start=started,
                                should_stop=signals, on_finish=eta.finish)
                    except _Stop as stop:
                        raise BenchInterrupted(stop.signum, count[0], total - count[0], csv_path) from None
        finally:
            writer.close()
        keys = spec_keys(spec)
        rows = [r for r in read_rows(csv_path) if row_key(r) in keys]
        files = [csv_path] + write_report(spec, rows, out_dir)
    finally:
        lock.close()
    return BenchRun(out_dir, total + skipped, count[0], skipped, time.perf_counter() - t0, files, repaired)
