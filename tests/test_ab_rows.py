"""benchmarks/ab_rows.py (two settings on the same bench rows, interleaved): its summary reads time to the proof per
arm as the median over proven runs, calls a row with any unproven run open, and takes B / A only where both arms
proved every run; its rows are the bench spec's tasks by name, an unknown name refused."""

from __future__ import annotations

import ab_rows
import pytest

from haap_milp.bench.spec import load_spec


def _run(row, arm, wall, proven=1):
    return {"row": row, "arm": arm, "wall_s": wall, "proven": proven}


def test_summary_medians_open_rows_and_the_geometric_mean():
    rows = [_run("x", "A", 10.0), _run("x", "B", 5.0), _run("x", "A", 12.0), _run("x", "B", 7.0), _run("x", "A", 11.0),
            _run("x", "B", 6.0),
            _run("y", "A", 4.0), _run("y", "B", 8.0),
            _run("z", "A", 3.0), _run("z", "B", 30.0, proven=0)]
    lines = ab_rows.summary(rows)
    assert "A  11.00 s" in lines[0] and "B   6.00 s" in lines[0] and "B/A 0.545" in lines[0]
    assert "B/A 2.000" in lines[1]
    assert "open 1/1" in lines[2] and "B/A" not in lines[2]  # (an open run: no ratio for the row)
    assert lines[3].startswith("geometric mean B/A over 2 rows") and lines[3].endswith(f"{(6 / 11 * 2) ** 0.5:.3f}")


def test_rows_are_the_specs_tasks_by_name():
    spec = load_spec(str(ab_rows.ROOT / "benchmarks/specs/default.yaml"))
    tasks = ab_rows._tasks(spec, list(ab_rows.HARD))
    assert [f"{t.model}@{t.cluster}" for t in tasks] == list(ab_rows.HARD)
    with pytest.raises(SystemExit, match="not-a-model@h100-16"):
        ab_rows._tasks(spec, ["not-a-model@h100-16"])
