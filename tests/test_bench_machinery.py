"""The bench machinery without solvers: spec validation, resume, failure rows, worker crashes, report.

Worker processes are spawned, so the fake task functions live at module level (picklable by name).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from haap_milp.bench.report import summarize
from haap_milp.bench.run import COLUMNS, Task, base_row, run_bench
from haap_milp.bench.spec import BenchSpec, default_spec, load_spec, parse_spec
from haap_milp.errors import HaapInputError

ROOT = Path(__file__).resolve().parents[1]

# objective per method of the fake: exact 1.0, dp 1.25, uniform 2.0 -> gains +25 % and +100 %
FAKE_T = {"cpsat": 1.0, "milp": 1.0, "dp": 1.25, "uniform": 2.0}


def fake_task(task: Task) -> list[dict]:
    """Deterministic rows; cluster 'crash' kills the worker process, 'raise' raises."""
    if task.inputs.cluster == "crash":
        os._exit(3)
    if task.inputs.cluster == "raise":
        raise RuntimeError("deliberate failure")
    rows = []
    for m, t in task.runs:
        exact = m in ("cpsat", "milp")
        rows.append({**base_row(task.inputs, m, t), "status": "OPTIMAL" if exact else "FEASIBLE",
                     "objective_s": FAKE_T[m], "bound_s": 0.995 if exact else "", "gap": 0.005 if exact else "",
                     "wall_s": 0.1 * (t or 1), "cluster_gpus": 16, "model_params_b": 8.0, "moe": 0})
    return rows


def never_called(task: Task) -> list[dict]:
    raise AssertionError(f"resume should have skipped {task}")


def _spec(clusters=("a", "b"), **kw) -> BenchSpec:
    data = {"name": "t", "models": ["m1"], "clusters": list(clusters), "methods": ["cpsat", "dp", "uniform"],
            "time_limits_s": [1, 2], **kw}
    return parse_spec(data)


def _rows(out: Path) -> list[dict]:
    with (out / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_default_yaml_is_the_builtin_default():
    assert load_spec(ROOT / "benchmarks/specs/default.yaml") == default_spec()
    spec = default_spec()
    assert {"cpsat", "milp", "dp", "uniform"} <= set(spec.methods)
    assert len(spec.models) >= 5 and len(spec.clusters) >= 5


def test_quick_yaml_is_valid():
    spec = load_spec(ROOT / "benchmarks/specs/quick.yaml")
    assert spec.tasks() and spec.runs()


def test_runs_heuristics_once_exact_per_limit():
    spec = _spec()
    assert spec.runs() == [("dp", None), ("uniform", None), ("cpsat", 1.0), ("cpsat", 2.0)]
    assert len(spec.tasks()) == 2


def test_exclude_and_per_model_batch():
    spec = parse_spec({"models": [{"name": "m1", "gbs": 64}, "m2"], "clusters": ["a", "b"], "gbs": [8, 16],
                       "exclude": [{"model": "m2", "cluster": "b"}]})
    got = [(t.model, t.cluster, t.gbs) for t in spec.tasks()]
    assert got == [("m1", "a", 64), ("m1", "b", 64), ("m2", "a", 8), ("m2", "a", 16)]


@pytest.mark.parametrize("bad, field", [
    ({"models": ["m"], "clusters": ["c"], "methods": ["simplex"]}, "methods"),
    ({"models": ["m"], "clusters": ["c"], "surprise": 1}, "surprise"),
    ({"models": [], "clusters": ["c"]}, "models"),
    ({"models": ["m"], "clusters": ["c"], "time_limits_s": [0]}, "time_limits_s"),
    ({"models": ["m"], "clusters": ["c", "c"]}, "duplicate"),
    ({"models": ["m", "m"], "clusters": ["c"]}, "duplicate model"),
    ({"models": ["m"], "clusters": ["c"], "gbs": [64, 64]}, "duplicate gbs"),
    ({"models": ["m"], "clusters": ["c"], "exclude": [{"model": "mm"}]}, "exclude model 'mm'"),  # (a typo skipped
    ({"models": ["m"], "clusters": ["c"], "exclude": [{"cluster": "d"}]}, "exclude cluster 'd'"),  # nothing silently)
    ({"models": [{"name": "m", "gbs": [0]}], "clusters": ["c"]}, "gbs"),
])
def test_bad_specs_are_one_paragraph(bad, field):
    with pytest.raises(HaapInputError) as err:
        parse_spec(bad)
    msg = str(err.value)
    assert field in msg and "\n" not in msg


def test_bad_yaml_file(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("models: [unclosed")
    with pytest.raises(HaapInputError, match="not valid YAML"):
        load_spec(p)
    with pytest.raises(HaapInputError, match="not a file"):
        load_spec(tmp_path / "missing.yaml")


def test_sweep_survives_crash_and_exception_then_resumes(tmp_path):
    spec = _spec(clusters=("a", "crash", "raise", "b"))
    res = run_bench(spec, tmp_path, workers=2, task_fn=fake_task)
    rows = _rows(tmp_path)
    assert len(rows) == 4 * 4 == res.runs_done and res.runs_skipped == 0
    by_cluster = {c: [r for r in rows if r["cluster"] == c] for c in ("a", "crash", "raise", "b")}
    assert {r["status"] for r in by_cluster["crash"]} == {"ERROR"}
    assert all("worker process died" in r["message"] for r in by_cluster["crash"])
    assert all("deliberate failure" in r["message"] for r in by_cluster["raise"])
    assert {r["status"] for r in by_cluster["a"] + by_cluster["b"]} == {"OPTIMAL", "FEASIBLE"}
    assert list(rows[0]) == list(COLUMNS)
    # resume: nothing is run again
    again = run_bench(spec, tmp_path, workers=2, task_fn=never_called)
    assert again.runs_done == 0 and again.runs_skipped == 16 and len(_rows(tmp_path)) == 16
    # --no-resume starts over
    fresh = run_bench(_spec(), tmp_path, workers=1, resume=False, task_fn=fake_task)
    assert fresh.runs_done == 8 and len(_rows(tmp_path)) == 8


def test_partial_resume_runs_only_missing(tmp_path):
    run_bench(_spec(clusters=("a",)), tmp_path, workers=1, task_fn=fake_task)
    res = run_bench(_spec(clusters=("a", "b")), tmp_path, workers=1, task_fn=fake_task)
    assert res.runs_done == 4 and res.runs_skipped == 4
    keys = [(r["cluster"], r["method"], r["time_limit_s"]) for r in _rows(tmp_path)]
    assert len(keys) == len(set(keys)) == 8


def test_summary_gains_and_plots(tmp_path):
    res = run_bench(_spec(), tmp_path, workers=1, task_fn=fake_task)
    names = {p.name for p in res.files}
    assert {"results.csv", "summary.md", "solve_time_vs_gpus.png", "gain_vs_model_size.png",
            "gap_vs_time_limit.png"} <= names
    for p in res.files:
        assert p.stat().st_size > 0
    recs = summarize(_rows(tmp_path))
    assert len(recs) == 2
    for r in recs:
        assert r["limit"] == 2.0 and r["best"]["method"] == "cpsat"
        assert r["gain_dp"] == pytest.approx(FAKE_T["dp"] / FAKE_T["cpsat"] - 1)
        assert r["gain_uniform"] == pytest.approx(FAKE_T["uniform"] / FAKE_T["cpsat"] - 1)
        assert r["gap"] == pytest.approx(0.005)
    text = (tmp_path / "summary.md").read_text()
    assert "T_dp / T_exact − 1" in text and "+25.0 %" in text and "+100.0 %" in text


def test_foreign_csv_is_refused(tmp_path):
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(HaapInputError, match="--no-resume"):
        run_bench(_spec(), tmp_path, workers=1, task_fn=fake_task)


def test_eta_from_finished_tasks_per_kind(monkeypatch):
    from haap_milp.bench import run as bench_run
    from haap_milp.bench.run import Eta, fmt_eta, plan_tasks

    clock = [0.0]
    monkeypatch.setattr(bench_run.time, "monotonic", lambda: clock[0])
    tasks, _ = plan_tasks(_spec(clusters=("a", "b", "c", "d", "e")), set())
    eta = Eta(workers=2)
    eta.plan(tasks)
    assert eta.seconds_left() is None and "after the first task" in fmt_eta(None)
    eta.start(tasks[0])
    eta.start(tasks[1])
    clock[0] = 10.0
    eta.finish(tasks[0])  # one task took 10 s: 3 pending + 1 in flight (10 s in, so ~0 left) over 2 workers
    assert eta.seconds_left() == pytest.approx(3 * 10.0 / 2)
    eta.finish(tasks[1])  # 10 s too
    eta.start(tasks[2])
    clock[0] = 14.0
    assert eta.seconds_left() == pytest.approx((2 * 10.0 + 6.0) / 2)
    assert fmt_eta(75) == "~1m15s left (estimate)" and fmt_eta(3 * 3600 + 60) == "~3h01m left (estimate)"


def test_progress_note_carries_the_estimate(tmp_path):
    notes = []
    run_bench(_spec(clusters=("a", "b", "c")), tmp_path, workers=1, task_fn=fake_task,
              progress=lambda done, total, note: notes.append((done, total, note)))
    assert notes[-1][:2] == (12, 12)
    assert "after the first task" in notes[0][2] and "left (estimate)" in notes[-2][2]
    assert "left" not in notes[-1][2]  # done: no estimate


def test_repair_csv_drops_only_broken_rows(tmp_path):
    from haap_milp.bench.run import repair_csv

    p = tmp_path / "results.csv"
    header = ",".join(COLUMNS) + "\r\n"
    row = ",".join(["x"] * len(COLUMNS)) + "\r\n"
    p.write_bytes((header + row + row).encode())
    assert repair_csv(p) == [] and p.read_bytes() == (header + row + row).encode()  # a sound file is untouched
    p.write_bytes((header + row + header + row[:9]).encode())
    notes = repair_csv(p)
    assert notes == ["line 3 repeats the header", "line 4 was cut short (no line end: the write was interrupted)"]
    assert p.read_bytes() == (header + row).encode()
    p.write_bytes(header[:10].encode())  # killed while writing the header
    assert repair_csv(p) == ["the header was cut short"] and p.read_bytes() == b""
    p.write_bytes(header[:-1].encode())  # all but its line feed
    assert repair_csv(p) == ["the header was cut short"] and p.read_bytes() == b""
