"""`haap-solve bench` is safe to kill: real driver processes on a tiny grid whose tasks sleep (test hook
``HAAP_BENCH_TEST_HOOK``), stopped by SIGTERM, SIGINT (to the driver alone) and kill -9; afterwards no worker
is left. Also the output-folder lock and the repair of a torn last CSV row.

Every wait is bounded: a worker that survives fails the test (and is then killed with its process group).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from haap_milp.bench.run import COLUMNS, LOCK_NAME, TEST_HOOK_ENV, lock_output
from haap_milp.errors import HaapInputError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SPEC = {"name": "sig", "methods": ["dp"], "gbs": [64], "seq": [1024], "models": ["gpt3-350m"],
        "clusters": [{"label": "fast", "cluster": "a100-80g:8"}, {"label": "slow1", "cluster": "a100-80g:8"},
                     {"label": "slow2", "cluster": "a100-80g:8"}]}
START_TIMEOUT_S = 60  # a loaded 2-core machine: driver start, two worker spawns, one presolve
GONE_TIMEOUT_S = 10  # SIGTERM -> SIGKILL after 2 s in the driver; the parent watch polls every 0.5 s


def _alive(pid: int) -> bool:
    """Running (a zombie is not: it computes nothing and holds nothing but its pid)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _wait_until(cond, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


class Driver:
    """A `haap-solve bench` process in its own session; tasks on slow1/slow2 sleep 120 s."""

    def __init__(self, tmp: Path, out: Path | None = None):
        self.tmp, self.out, self.marks = tmp, out or tmp / "out", tmp / "started"
        self.marks.mkdir(exist_ok=True)
        spec = tmp / "sig.yaml"
        spec.write_text(yaml.safe_dump(SPEC))
        env = {**os.environ, TEST_HOOK_ENV: f"sleep=120,sleep_on=slow,started={self.marks}"}
        cmd = [sys.executable, "-c", "from haap_milp.cli import main; main()", "bench", str(spec), "--out",
               str(self.out), "--workers", "2"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, cwd=tmp)
        self.workers: list[int] = []

    def wait_busy(self) -> list[int]:
        """Until the fast task finished and both workers are inside a sleeping task; returns every child pid."""
        _wait_until(lambda: len(list(self.marks.iterdir())) >= 3 or self.proc.poll() is not None, START_TIMEOUT_S,
                    "three tasks to start")
        assert self.proc.poll() is None, self.proc.communicate()
        self.workers = _children(self.proc.pid)
        marked = {int(p.name.split("-")[0]) for p in self.marks.iterdir()}
        assert len(marked & set(self.workers)) == 2, (marked, self.workers)
        return self.workers

    def finish(self, timeout: float = GONE_TIMEOUT_S) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError("the driver did not exit") from None
        return self.proc.returncode, out, err

    def kill_all(self) -> None:
        for pid in [self.proc.pid, *self.workers]:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def driver(tmp_path):
    d = Driver(tmp_path)
    yield d
    d.kill_all()  # only if a test failed half-way
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.communicate(timeout=10)


def _assert_csv_sound(path: Path, fast_rows: int) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\r\n")
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == COLUMNS and all(len(r) == len(COLUMNS) for r in rows)
    recs = [dict(zip(COLUMNS, r)) for r in rows[1:]]
    assert [r["cluster"] for r in recs] == ["fast"] * fast_rows
    return recs


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_driver_stops_workers_and_says_how_to_resume(driver, sig, code):
    workers = driver.wait_busy()
    # while it runs, the folder is locked by the driver
    with pytest.raises(HaapInputError, match=f"pid {driver.proc.pid}"):
        lock_output(driver.out)
    os.kill(driver.proc.pid, sig)  # the driver alone, not its process group
    t0 = time.monotonic()
    rc, _, err = driver.finish()
    gone = _wait_until(lambda: not any(_alive(p) for p in workers), GONE_TIMEOUT_S, "the workers to end")
    print(f"{signal.Signals(sig).name}: driver exit after {time.monotonic() - t0 - gone:.2f} s, "
          f"every worker gone {gone:.2f} s later")
    assert rc == code, err
    assert f"interrupted by {signal.Signals(sig).name}" in err and "Resume with" in err and "Traceback" not in err
    resume = err.split("Resume with:", 1)[1].split()
    assert resume[:3] == ["haap-solve", "bench", str(driver.tmp / "sig.yaml")] and "--out" in resume
    _assert_csv_sound(driver.out / "results.csv", fast_rows=1)  # the finished task's row, whole
    lock_output(driver.out).close()  # the lock went with the driver


def test_kill_9_of_driver_takes_workers_down(driver):
    workers = driver.wait_busy()
    os.kill(driver.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    driver.proc.wait(timeout=GONE_TIMEOUT_S)
    gone = _wait_until(lambda: not any(_alive(p) for p in workers), GONE_TIMEOUT_S, "the orphaned workers to end")
    print(f"kill -9: every worker gone {time.monotonic() - t0:.2f} s after the kill ({gone:.2f} s after the driver)")
    _assert_csv_sound(driver.out / "results.csv", fast_rows=1)
    lock_output(driver.out).close()


def test_second_run_into_locked_folder_exits_2(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    held = lock_output(out)  # this process holds it, as a running bench does
    try:
        spec = tmp_path / "s.yaml"
        spec.write_text(yaml.safe_dump(SPEC))
        cmd = [sys.executable, "-c", "from haap_milp.cli import main; main()", "bench", str(spec), "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    finally:
        held.close()
    assert proc.returncode == 2, proc.stderr
    msg = " ".join(proc.stderr.split())
    assert "--out" in msg and str(out) in msg and f"pid {os.getpid()}" in msg
    assert not (out / "results.csv").exists() and (out / LOCK_NAME).is_file()


def test_torn_last_row_is_dropped_and_rerun(tmp_path):
    from typer.testing import CliRunner

    from haap_milp.cli import app

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "clusters": SPEC["clusters"][:2]}))
    out = tmp_path / "out"
    args = ["bench", str(spec), "--out", str(out), "--workers", "2"]
    first = CliRunner().invoke(app, args, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    csv_path = out / "results.csv"
    whole = csv_path.read_bytes()
    lines = whole.split(b"\r\n")
    assert len(lines) == 4 and lines[-1] == b""  # header, 2 rows
    torn = lines[0] + b"\r\n" + lines[1] + b"\r\n" + lines[2][: len(lines[2]) // 2]  # the last write cut short
    before = list(csv.reader([ln.decode() for ln in lines[1:3]]))
    csv_path.write_bytes(torn)
    again = CliRunner().invoke(app, args, catch_exceptions=False)
    assert again.exit_code == 0, again.output
    text = " ".join(again.output.split())
    assert "line 3 was cut short" in text and "1 runs done, 1 skipped" in text
    with csv_path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert csv_path.read_bytes().endswith(b"\r\n") and all(len(r) == len(COLUMNS) for r in rows)
    assert rows[1] == before[0] and rows[2][:7] == before[1][:7]  # the whole row kept, the torn one rerun
    # (a wrong column count or a repeated header: test_bench_machinery.py::test_repair_csv_drops_only_broken_rows)


WATCHED = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", '''
import os, sys, time
from haap_milp.bench.run import worker_init
sys.platform = "not-linux"  # no PR_SET_PDEATHSIG: the parent watch alone must end this process
worker_init(os.getppid())
print("ready", flush=True)
time.sleep(60)
'''], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
os._exit(0)  # the parent dies without a word; the child is orphaned
"""


def test_parent_watch_alone_ends_an_orphaned_worker():
    proc = subprocess.run([sys.executable, "-c", WATCHED], capture_output=True, text=True, timeout=60, check=True)
    orphan = int(proc.stdout.split()[-1])
    try:
        gone = _wait_until(lambda: not _alive(orphan), GONE_TIMEOUT_S, "the orphan's parent watch")
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)
    print(f"parent watch: orphan gone {gone:.2f} s after its parent")


def test_stopping_the_pool_joins_its_manager_thread():
    """``_stop_pool`` ends the workers and waits for the pool's manager thread, which closes its wake-up pipe as it
    ends: CPython 3.11's exit hook writes to that pipe while it looks open, and a close in between printed "Bad file
    descriptor" with a traceback after "interrupted by SIGTERM" (CI, twice). The thread is taken before ``shutdown``,
    which drops the pool's reference to it (read after, it was None and the join never ran)."""
    import multiprocessing

    from haap_milp.bench.run import _pool, _stop_pool

    pool = _pool(1, multiprocessing.get_context("spawn"))
    pool.submit(time.sleep, 30)
    manager = pool._executor_manager_thread
    assert manager is not None and manager.is_alive()
    procs = list(pool._processes.values())
    _stop_pool(pool)
    assert not manager.is_alive()
    assert not any(p.is_alive() for p in procs)
