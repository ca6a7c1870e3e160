"""Sailor's Fig. 8b OPT-350M rows (issue 11): the time `haap-solve solve` takes, end to end, to prove 1 %.

Each of the three rows (32+96, 80+240, 128+384 GPUs of A100-40GB + V100-16GB, 4 a node) is solved with the flags of
`benchmarks/sailor_fig8b.py` (fp32, the DeepSpeed runtime without ZeRO, uniform dp, Sailor's measured network
imported from tests/data/sailor_network) with the measured profiles (tests/data/profiles/OPT-350) and without them,
as a fresh process, 2 solver threads, `--time-limit` 10 s. The wall time is the process's, start to exit (imports,
presolve, heuristics, search, report). Sailor's own search on this machine class takes 1.2 / 4.2 / 14.2 s
(issue 11); the table puts each row's time beside it.

    python benchmarks/sailor_rows_speed.py [--repeats 3] [--out benchmarks/results/sailor_rows_speed.csv]

Prints one line per solve and the medians; writes the CSV (one row per solve).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = (("32+96", 32, 96, 1.2), ("80+240", 80, 240, 4.2), ("128+384", 128, 384, 14.2))  # Sailor's search, s
PROFILE = ["--profile", str(ROOT / "tests/data/profiles/OPT-350"), "--profile-device", "A100=a100-40g",
           "--profile-device", "V100=v100-16g"]
FLAGS = ["--gbs", "1024", "--seq", "2048", "--precision", "fp32", "--engine", "deepspeed", "--no-dist-opt",
         "--recompute", "none", "--uniform", "dp", "--threads", "2"]


def _cli() -> list[str]:
    return [sys.executable, "-m", "haap_milp.cli"]


def network(tmp: Path) -> Path:
    out = tmp / "net.yaml"
    subprocess.run(_cli() + ["network", "import", "--format", "sailor",
                             str(ROOT / "tests/data/sailor_network/multizone_bandwidths_het.json"),
                             "--zone", "us-central1-a", "--out", str(out)], check=True, capture_output=True)
    return out


def solve(net: Path, a100: int, v100: int, profile: bool, limit: float, tmp: Path) -> dict:
    doc = tmp / "plan.json"
    cmd = _cli() + ["solve", "-m", "opt-350m", "-c", f"a100-40g:{a100}/4,v100-16g:{v100}/4", "--network", str(net),
                    *FLAGS, *(PROFILE if profile else []), "--time-limit", str(limit), "--json", str(doc)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # (its failure is reported below)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"solve failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    d = json.loads(doc.read_text())
    stats = d.get("stats", {})
    return {"status": d["status"], "gap_pct": round(100 * d["gap"], 3) if d.get("gap") is not None else None,
            "iteration_time_s": d["iteration_time_s"], "wall_s": round(wall, 3), "nodes": stats.get("nodes"),
            "search_start_s": stats.get("total_wall_s")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/sailor_rows_speed.csv")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        net = network(Path(tmp))
        for rep in range(a.repeats):
            for name, na, nv, sailor in ROWS:
                for profile in (True, False):
                    r = {"row": name, "prices": "profile" if profile else "analytic", "repeat": rep,
                         "sailor_search_s": sailor,
                         **solve(net, na, nv, profile, a.time_limit, Path(tmp)), "load1": round(os.getloadavg()[0], 2)}
                    rows.append(r)
                    print(f"{name:8s} {r['prices']:8s} {r['status']:9s} gap {r['gap_pct']}% T {r['iteration_time_s']:.5f} s"
                          f"  {r['wall_s']:.2f} s end to end  nodes {r['nodes']}  (Sailor {sailor} s)", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = a.out.with_suffix(".tmp")
    with tmp_out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    tmp_out.replace(a.out)
    print("median end to end (s), profile / analytic, against Sailor's search:")
    for name, _na, _nv, sailor in ROWS:
        med = [statistics.median(r["wall_s"] for r in rows if r["row"] == name and r["prices"] == p)
               for p in ("profile", "analytic")]
        print(f"  {name:8s} {med[0]:.2f} / {med[1]:.2f} s   Sailor {sailor} s   ratio {max(med) / sailor:.2f}x")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
