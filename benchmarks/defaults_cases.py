"""Issue #15 defaults: the four cases outside the repo where a dimension pays, solved with plain commands (no
dimension flag) and with the dimension switched off, through the CLI. Prints a markdown table row per run.

Usage: python benchmarks/defaults_cases.py [TIME_LIMIT_S]   (default 60; threads 2)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [  # (name, base args, the flags that switch the dimension off: the old default first)
    ("small batch, deep pipeline (vpp)", ["--model", "llama3-70b", "--cluster", "a100-40g:64", "--gbs", "16"],
     [["--vpp", "1"]]),
    ("128k tokens (cp)", ["--model", "llama3-8b", "--cluster", "h100-80g:16", "--gbs", "16", "--seq", "131072"],
     [["--cp", "1"]]),
    ("FSDP-only runtime (zero)", ["--model", "llama2-13b", "--cluster", "a100-40g:16", "--gbs", "64", "--engine",
                                  "fsdp", "--target", "torchtitan", "--max-stages", "1"],
     [["--zero-stage", "3"], ["--zero", "0"]]),
    ("FSDP runtime, pipelined (zero)", ["--model", "llama3-8b", "--cluster", "h100-80g:32,a100-80g:32", "--gbs",
                                        "512", "--engine", "fsdp"], [["--zero-stage", "3"]]),
    ("two types too few to pipeline (mixed stages)", ["--model", "llama3-8b", "--cluster", "h100-80g:8,a100-80g:8",
                                                      "--gbs", "64"], [["--vpp", "1"], ["--vpp", "1", "--mixed-stages", "off"]]),
    # etp stays 1 by default (eqs. D1-D3), so this case asks for it: 128 experts over 8-GPU nodes, ep spans nodes
    ("MoE, experts > GPUs per node (etp, ep)", ["--model", "qwen3-235b-a22b", "--cluster", "h100-80g:64", "--gbs",
                                                "256", "--etp", "auto"], [["--etp", "1"]]),
]


def run(args: list[str], limit: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "haap_milp.cli", "solve", *args, "--time-limit", str(limit),
                        "--threads", "2", "--json", str(out)], check=True, capture_output=True)
        r = json.loads(out.read_text())
        r["_wall"] = time.perf_counter() - t0
        return r


def dims(r: dict) -> str:
    p = r.get("plan")
    if not p:
        return r.get("status", "?")
    zs = sorted({str(s.get("zero")) for s in p["stages"]})
    mixed = any(s.get("replicas") for s in p["stages"])
    moe = "".join(f", {k} {','.join(str(s.get(k, 1)) for s in p['stages'])}" for k in ("ep", "etp")
                  if any((s.get(k) or 1) > 1 for s in p["stages"]))
    return (f"pp {len(p['stages'])}, vpp {p.get('vpp', 1)}, cp {p.get('cp', 1)}, ZeRO {','.join(zs)}, "
            f"tp {','.join(str(s['tp']) for s in p['stages'])}{moe}" + (", mixed stage" if mixed else ""))


def main() -> None:
    limit = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    print("| case | command | T plain (s) | plan plain | T dimension off (s) | plan off | gain | wall plain / off (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, base, offs in CASES:
        a = run(base, limit)
        for off in offs:
            b = run(base + off, limit)
            ta, tb = a.get("iteration_time_s") or float("nan"), b.get("iteration_time_s") or float("nan")
            print(f"| {name} | `solve {' '.join(base)}` | {ta:.3f} ({a['status']}) | {dims(a)} | {tb:.3f} ({b['status']}) "
                  f"with `{' '.join(off)}` | {dims(b)} | {100 * (tb - ta) / tb:+.1f} % | {a['_wall']:.1f} / "
                  f"{b['_wall']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
