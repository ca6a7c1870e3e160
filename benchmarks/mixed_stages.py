"""Mixed stages (formulations/ eqs. H1-H7): gain over the search without them, and their solve-time cost.

Each instance is solved twice by `haap-solve solve` (CP-SAT, same time limit, same machine, one after the
other): `--mixed-stages on` and `--mixed-stages off`. Reported: the predicted iteration time of each plan,
the gain (off - on) / off, whether the plan uses a mixed stage, presolve time and options, the exact
search's wall time and status/gap, and the ratio of the two commands' wall times (measured in this run).
Instances: two GPU types too few to pipeline (8 H100 + 8 A100, llama3-8b, small and default batch), the
default grid's two-type clusters, and Sailor's Fig. 8b 32+96 row planned from its measured profiles and
network (tests/data, MIT; as in benchmarks/sailor_fig8b.py, `--uniform dp`).

    python benchmarks/mixed_stages.py [--time-limit 30] [--out benchmarks/results/mixed_stages.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXE = os.environ.get("HAAP_SOLVE", "haap-solve")
NET_SRC = ROOT / "tests" / "data" / "sailor_network" / "multizone_bandwidths_het.json"
SAILOR = ["--seq", "2048", "--precision", "fp32", "--engine", "deepspeed", "--no-dist-opt", "--recompute", "none",
          "--uniform", "dp", "--profile", str(ROOT / "tests" / "data" / "profiles" / "OPT-350"),
          "--profile-device", "A100=a100-40g", "--profile-device", "V100=v100-16g"]

# (label, model, cluster, gbs, extra args; "NET" is replaced by the imported Sailor network)
INSTANCES = [
    ("8 H100 + 8 A100, gbs 64", "llama3-8b", "h100-80g:8,a100-80g:8", 64, []),
    ("8 H100 + 8 A100, gbs 512", "llama3-8b", "h100-80g:8,a100-80g:8", 512, []),
    ("8 H100 + 8 A100 gpt3-1.3b, gbs 512", "gpt3-1.3b", "h100-80g:8,a100-80g:8", 512, []),
    ("h100+a100-64 llama3-8b", "llama3-8b", "h100-80g:32,a100-80g:32", 512, []),
    ("a100-80g+40g-64 llama3-8b", "llama3-8b", "a100-80g:32,a100-40g:32", 512, []),
    ("3types-256 llama3-70b", "llama3-70b", "h100-80g:64,a100-80g:128,a100-40g:64", 1024, []),
    ("Sailor 32+96 OPT-350M (profiles)", "opt-350m", "a100-40g:32/4,v100-16g:96/4", 1024, ["--network", "NET", *SAILOR]),
]


def solve(model: str, cluster: str, gbs: int, extra: list[str], mixed: str, limit: float, out: Path) -> dict:
    args = [EXE, "solve", "-m", model, "-c", cluster, "--gbs", str(gbs), "--time-limit", str(limit), "--solver",
            "cpsat", "--mixed-stages", mixed, "--json", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        return {"error": " ".join((proc.stdout + proc.stderr).split())[-300:], "command_s": wall}
    doc = json.loads(out.read_text())
    doc["command_s"] = wall
    return doc


def sailor_plan(tmp: Path, net: Path) -> str:
    """Sailor's published 32+96 plan (../shared/peers/sailor_fig8b/README.md: stage 0 = embedding + decoder
    blocks 1-12 on 3 A100 tp1 + 24 V100 tp4 replicas, stage 1 = blocks 13-24 + head on 27 A100 tp1, every
    replica at micro-batch 2, 19 micro-batches = 1026 samples), now expressible, scored by `estimate` with
    the same profiles and network; time scaled by 1024/1026 as benchmarks/sailor_fig8b.py does for 80+240."""
    reps = [{"gpu_type": "a100-40g", "tp": 1, "count": 3, "micro_batch": 2},
            {"gpu_type": "v100-16g", "tp": 4, "count": 24, "micro_batch": 2}]
    plan = {"model": "opt-350m", "cluster": "a100-40g:32/4,v100-16g:96/4", "micro_batch_size": 2,
            "global_batch_size": 1026, "num_microbatches": 19, "seq_len": 2048, "precision": "fp32",
            "stages": [{"first_layer": 0, "num_layers": 12, "gpu_type": "a100-40g", "tp": 1, "dp": 27,
                        "replicas": reps},
                       {"first_layer": 12, "num_layers": 12, "gpu_type": "a100-40g", "tp": 1, "dp": 27}]}
    path = tmp / "sailor.json"
    path.write_text(json.dumps({"plan": plan}))
    proc = subprocess.run([EXE, "estimate", "--plan", str(path), "--network", str(net), "--gbs", "1026",
                           *[a for a in SAILOR if a not in ("--uniform", "dp")], "--json"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return "error: " + " ".join((proc.stdout + proc.stderr).split())[-300:]
    t = json.loads(proc.stdout)["iteration_time_s"] * 1024 / 1026
    return f"{t:.3f} s per 1024 samples ({1 / t:.3f} it/s; Sailor's simulator: 0.170 it/s)"


def describe(doc: dict) -> str:
    plan = doc.get("plan")
    if not plan:
        return doc.get("status", "?")
    parts = []
    for s in plan["stages"]:
        if s.get("replicas"):
            parts.append(" + ".join(f"{r['count']}x{r['gpu_type'][:4]} tp{r['tp']} m{r['micro_batch']}"
                                    for r in s["replicas"]) + f" [{s['num_layers']}L]")
        else:
            parts.append(f"{s['gpu_type'][:4]} tp{s['tp']} dp{s['dp']} [{s['num_layers']}L]")
    return "; ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mixed_stages.md")
    ap.add_argument("--only", default="", help="run the instances whose label contains this text")
    args = ap.parse_args()
    rows, plans = [], []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        net = tmp / "net.yaml"
        subprocess.run([EXE, "network", "import", "--format", "sailor", str(NET_SRC), "--zone", "us-central1-a",
                        "-o", str(net)], capture_output=True, check=True)
        for label, model, cluster, gbs, extra in INSTANCES:
            if args.only not in label:
                continue
            extra = [str(net) if a == "NET" else a for a in extra]
            res = {m: solve(model, cluster, gbs, extra, m, args.time_limit, tmp / f"{m}.json") for m in ("on", "off")}
            on, off = res["on"], res["off"]
            if "error" in on or "error" in off:
                rows.append(f"| {label} | error: {on.get('error') or off.get('error')} |||||||||")
                continue
            t_on, t_off = on["iteration_time_s"], off["iteration_time_s"]
            mixed = any(s.get("replicas") for s in (on.get("plan") or {}).get("stages", []))
            st_on, st_off = on["stats"], off["stats"]
            rows.append(
                f"| {label} | {t_off:.3f} | {t_on:.3f} | {(t_off - t_on) / t_off:+.1%} | {'yes' if mixed else 'no'} "
                f"| {st_on.get('mixed_options', 0)} | {st_off.get('presolve_s', 0):.2f} / {st_on.get('presolve_s', 0):.2f} "
                f"| {off['wall_time_s']:.1f} / {on['wall_time_s']:.1f} | {off['status']} {_gap(off)} / {on['status']} "
                f"{_gap(on)} | {on['command_s'] / off['command_s']:.2f} |")
            plans.append(f"- {label}: off: {describe(off)}; on: {describe(on)}")
            print(rows[-1], flush=True)
        scored = sailor_plan(tmp, net) if "Sailor" in " ".join(r for r in rows) else ""
    intro = (f"Produced by `python benchmarks/mixed_stages.py --time-limit {args.time_limit:g}` (CP-SAT, 2 threads, "
             "this machine, loaded by other jobs). Times are haap's predicted iteration times in seconds; gain = "
             "(off - on) / off. 'search s' is the solver's wall time, 'cmd ratio' the whole command's wall time "
             "with mixed stages over without, measured in the same run.")
    header = ("| instance | off: T s | on: T s | gain | mixed stage used | mixed options kept | presolve s off / on "
              "| search s off / on | status off / on | cmd ratio on/off |")
    lines = ["# Mixed stages: gain and solve-time cost", "", intro, "", header,
             "|---|---|---|---|---|---|---|---|---|---|", *rows, "", "Plans:", "", *plans, ""]
    if scored:
        lines += [("Sailor's published 32+96 plan (a mixed first stage: 3 A100 tp1 + 24 V100 tp4 replicas), scored "
                   f"by haap with the same profiles and network: {scored}."), ""]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


def _gap(doc: dict) -> str:
    g = doc.get("gap")
    return "" if g is None else f"{g:.1%}"


if __name__ == "__main__":
    raise SystemExit(main())
