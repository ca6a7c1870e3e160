"""`haap-solve bench` end to end on a tiny grid with the real planner: files, consistency, resume, failure rows."""

from __future__ import annotations

import csv
import math
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from haap_milp.bench.run import TEST_HOOK_ENV
from haap_milp.cli import app

SMALL, BIG = "gpt3-350m", "llama3-70b"
SPEC = {
    "name": "tiny",
    "methods": ["cpsat", "dp", "uniform"],
    "time_limits_s": [3],
    "gbs": [64],
    "seq": [1024],
    "threads": 1,
    "models": [SMALL, BIG],
    "clusters": [
        {"label": "a100-8", "cluster": "a100-80g:8"},
        {"label": "h100+a100-16", "cluster": "h100-80g:8,a100-80g:8"},
        {"label": "tiny-40g", "cluster": "a100-40g:4/4"},  # 70B cannot fit: INFEASIBLE rows
        {"label": "typo", "cluster": "a100-80g:4/4"},  # its solver calls fail (test hook): ERROR rows
    ],
    "exclude": [{"model": BIG, "cluster": "a100-8"}, {"model": BIG, "cluster": "h100+a100-16"},
                {"model": SMALL, "cluster": "tiny-40g"}, {"model": BIG, "cluster": "typo"}],
}


def _invoke(args):
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    spec = tmp / "tiny.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp / "out"
    with pytest.MonkeyPatch.context() as mp:  # the spawned workers inherit it: every solver call on "typo" raises
        mp.setenv(TEST_HOOK_ENV, "fail=typo")
        output = _invoke(["bench", str(spec), "--out", str(out), "--workers", "2"])
    with (out / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return spec, out, output, rows


def test_files_written(first_run):
    _, out, output, rows = first_run
    assert "12 runs done, 0 skipped" in output
    for name in ("results.csv", "summary.md", "solve_time_vs_gpus.png", "gain_vs_model_size.png",
                 "gap_vs_time_limit.png"):
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(rows) == 4 * 3  # 4 tasks (after exclusions) x (dp, uniform, cpsat@3s)


def test_feasible_rows_are_consistent(first_run):
    rows = first_run[3]
    ok = [r for r in rows if r["model"] == SMALL and r["cluster"] in ("a100-8", "h100+a100-16")]
    assert len(ok) == 6
    for r in ok:
        assert r["status"] in ("OPTIMAL", "FEASIBLE"), r
        t, tps = float(r["objective_s"]), float(r["tokens_per_s"])
        assert t > 0 and 0 < float(r["mfu"]) < 1
        assert tps == pytest.approx(SPEC["gbs"][0] * SPEC["seq"][0] / t, rel=1e-3)  # same T as the estimator's
        assert 1 <= int(r["num_gpus_used"]) <= int(r["cluster_gpus"]) and int(r["stages"]) >= 1
    for cluster in ("a100-8", "h100+a100-16"):
        by = {r["method"]: r for r in ok if r["cluster"] == cluster}
        exact, dp = float(by["cpsat"]["objective_s"]), float(by["dp"]["objective_s"])
        assert exact <= dp * (1 + 1e-6)  # warm-started from DP: never worse
        if by["cpsat"]["bound_s"]:
            assert float(by["cpsat"]["bound_s"]) <= exact * (1 + 1e-6)


def test_failures_are_rows(first_run):
    rows = first_run[3]
    infeasible = [r for r in rows if r["cluster"] == "tiny-40g"]
    assert {r["status"] for r in infeasible} == {"INFEASIBLE"} and all(r["message"] for r in infeasible)
    typo = [r for r in rows if r["cluster"] == "typo"]
    assert len(typo) == 3 and {r["status"] for r in typo} == {"ERROR"}
    assert all("injected solver failure" in r["message"] for r in typo)


def test_summary_matches_csv(first_run):
    _, out, _, rows = first_run
    text = (out / "summary.md").read_text()
    assert "T_dp / T_exact − 1" in text and "(T_exact − bound) / T_exact" in text
    for cluster in ("a100-8", "h100+a100-16"):
        by = {r["method"]: r for r in rows if r["cluster"] == cluster and r["model"] == SMALL}
        gain = float(by["dp"]["objective_s"]) / float(by["cpsat"]["objective_s"]) - 1
        assert f"{100 * gain:+.1f} %" in text
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {SMALL} | {cluster} |"))
        assert f"{float(by['cpsat']['objective_s']):.3f}" in line and not math.isnan(gain)


def test_resume_skips_every_run(first_run):
    spec, out, _, _ = first_run
    before = (out / "results.csv").read_bytes()
    output = _invoke(["bench", str(spec), "--out", str(out), "--workers", "2"])
    assert "0 runs done, 12 skipped" in output
    assert (out / "results.csv").read_bytes() == before


def test_bad_spec_is_one_paragraph(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SPEC, "methods": ["simplex"]}))
    cmd = [sys.executable, "-c", "from haap_milp.cli import main; main()", "bench", str(bad), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "methods" in proc.stderr and "simplex" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "results.csv").exists()


def _main(args, **kw):
    cmd = [sys.executable, "-c", "from haap_milp.cli import main; main()", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60, **kw)


def test_unloadable_cluster_exits_2_before_any_run(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SPEC, "clusters": [*SPEC["clusters"], {"label": "x", "cluster": "no-such-gpu:8"}]}))
    proc = _main(["bench", str(bad), "--out", str(tmp_path / "out")])
    assert proc.returncode == 2, proc.stderr
    assert "clusters.4" in proc.stderr and "no-such-gpu" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "results.csv").exists()


def test_missing_network_file_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SPEC, "clusters": [{"cluster": "a100-80g:8", "network": str(tmp_path / "n.yaml")}],
                                   "exclude": []}))
    proc = _main(["bench", str(bad), "--out", str(tmp_path / "out")])
    assert proc.returncode == 2 and "clusters.0" in proc.stderr and "n.yaml" in proc.stderr, proc.stderr


def test_no_spec_refuses_and_lists_builtin_specs(tmp_path):
    proc = _main(["bench", "--out", str(tmp_path / "out")], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "SPEC.yaml" in proc.stderr and "'default'" in proc.stderr and "haap-solve bench default" in proc.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("bench-*"))


def test_bad_workers_names_the_flag(tmp_path):
    proc = _main(["bench", "default", "--workers", "0", "--out", str(tmp_path / "out")])
    assert proc.returncode == 2 and "--workers" in proc.stderr


def test_help_documents_default_and_resume():
    import os

    proc = _main(["bench", "--help"], env={**os.environ, "COLUMNS": "200"})
    text = " ".join(proc.stdout.split())
    assert "'default'" in text and "exits 2" in text and "resumes" in text


def test_bad_search_space_names_the_key(tmp_path):
    """The spec's ``search`` field (solve | plain): another value is one paragraph naming the key and value, exit 2."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SPEC, "search": "wide"}))
    proc = _main(["bench", str(bad), "--out", str(tmp_path / "out")])
    assert proc.returncode == 2, proc.stderr
    assert "search" in proc.stderr and "wide" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "results.csv").exists()
