"""Behaviour check for refactors: the default grid's objectives before and after a change.

Runs `haap-solve solve` (the CLI, the one interface that stays stable across a refactor) on every task
of benchmarks/specs/default.yaml with the deterministic methods (DP heuristic, uniform baseline) and
with CP-SAT on one thread, and writes one JSON line per (task, method): status, iteration time, the
plan's stages and the presolve statistics that describe the search space.

    python benchmarks/behaviour_check.py --out benchmarks/results/behaviour/after.jsonl
    python benchmarks/behaviour_check.py --compare before.jsonl after.jsonl

`--compare` demands, per (task, method):
  * dp and uniform: the same status, the same iteration time (relative 1e-9) and the same stages;
  * cpsat: the same status; where both runs prove a gap, the objectives agree within the larger of
    the two proven gaps (CP-SAT stops at 1 %, so two correct runs may return different plans inside
    that gap; equality beyond it would be luck, not a property);
  * the presolve statistics options_kept / variants_kept / max_stages equal.
It prints one line per difference and a summary, and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "benchmarks" / "specs" / "default.yaml"
STATS = ("options_kept", "variants_kept", "max_stages")


def tasks(spec_path: Path) -> list[dict]:
    spec = yaml.safe_load(spec_path.read_text())
    out = []
    for m in spec["models"]:
        for c in spec["clusters"]:
            for gbs in m.get("gbs", spec["gbs"]):
                for seq in spec["seq"]:
                    out.append({"model": m["name"], "cluster": c["cluster"], "label": c["label"], "gbs": gbs,
                                "seq": seq})
    return out


def run_one(task: dict, method: str, exe: str, time_limit: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        cmd = [exe, "solve", "-m", task["model"], "-c", task["cluster"], "--gbs", str(task["gbs"]),
               "--seq", str(task["seq"]), "--solver", method, "--threads", "1", "--time-limit", str(time_limit),
               "--json", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=time_limit * 4 + 300, check=False)
        row = {"model": task["model"], "cluster": task["label"], "gbs": task["gbs"], "seq": task["seq"],
               "method": method, "exit": proc.returncode}
        if not out.exists():
            row["error"] = (proc.stderr or proc.stdout)[-400:]
            return row
        d = json.loads(out.read_text())
    plan = d.get("plan") or {}
    row.update(status=d["status"], iteration_time_s=d.get("iteration_time_s"), gap=d.get("gap"),
               stats={k: d.get("stats", {}).get(k) for k in STATS},
               num_microbatches=plan.get("num_microbatches"), micro_batch_size=plan.get("micro_batch_size"),
               stages=[{k: s.get(k) for k in ("first_layer", "num_layers", "gpu_type", "island", "tp", "dp", "ep",
                                               "recompute")} for s in plan.get("stages", [])])
    return row


def key(r: dict) -> tuple:
    return (r["model"], r["cluster"], r["gbs"], r["seq"], r["method"])


def compare(before: Path, after: Path) -> int:
    a = {key(r): r for r in map(json.loads, before.read_text().splitlines())}
    b = {key(r): r for r in map(json.loads, after.read_text().splitlines())}
    diffs, same = [], 0
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            diffs.append(f"{k}: only in {'after' if k not in a else 'before'}")
            continue
        x, y = a[k], b[k]
        why = []
        if x.get("status") != y.get("status"):
            why.append(f"status {x.get('status')} -> {y.get('status')}")
        if x.get("stats") != y.get("stats"):
            why.append(f"presolve stats {x.get('stats')} -> {y.get('stats')}")
        tx, ty = x.get("iteration_time_s"), y.get("iteration_time_s")
        if (tx is None) != (ty is None):
            why.append(f"time {tx} -> {ty}")
        elif tx is not None:
            rel = abs(tx - ty) / min(tx, ty)
            if k[-1] == "cpsat":
                tol = max(x.get("gap") or 0.0, y.get("gap") or 0.0) + 1e-9
            else:
                tol = 1e-9
                if x.get("stages") != y.get("stages"):
                    why.append("stages differ")
            if rel > tol:
                why.append(f"time {tx:.6f} -> {ty:.6f} ({rel:.2e} > {tol:.2e})")
        if why:
            diffs.append(f"{k}: " + "; ".join(why))
        else:
            same += 1
    for line in diffs:
        print("DIFF", line)
    print(f"{same} of {len(set(a) | set(b))} (task, method) pairs agree; {len(diffs)} differ")
    return 1 if diffs else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path)
    ap.add_argument("--methods", default="dp,uniform,cpsat")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--exe", default=os.environ.get("HAAP_SOLVE", "haap-solve"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        ap.error("--out or --compare is required")
    jobs = [(t, m) for t in tasks(SPEC) for m in args.methods.split(",")]
    with ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(lambda tm: run_one(tm[0], tm[1], args.exe, args.time_limit), jobs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    print(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
