"""Solve-time scaling: GPUs {16..4096} x GPU types {1, 2, 3} x models {gpt3-13b, llama3-70b, llama3-405b}.

A bench spec run through the `haap-solve bench` machinery (haap_milp.bench), then condensed into
benchmarks/results/solve_scaling.csv and solve_scaling.md: per instance the CP-SAT status, proven gap,
solve time and end-to-end time (presolve + DP warm start + CP-SAT), the DP objective and time, and the
uniform Megatron-style baseline.

Clusters (nodes of 8 GPUs; when there are fewer nodes than types, nodes of 4 GPUs are used instead):
  1 type : h100-80g
  2 types: h100-80g + a100-80g, nodes split half/half
  3 types: h100-80g + a100-80g + a100-40g, nodes split in thirds (the first types get the remainder)
so 16 GPUs x 3 types is h100-80g:8/4 + a100-80g:4/4 + a100-40g:4/4, and 1024 x 3 is 344 + 344 + 336.

Targets (issue 4): proven optimal (gap <= 1 %) within 10 s at 1024 GPUs x 3 types x 80 layers, and within
60 s at 4096 GPUs, on a 2-core machine.

Usage:  .venv/bin/python benchmarks/solve_scaling.py [--workers 2] [--time-limit 60] [--no-resume]
        [--gpus 16 64 ...] [--types 1 2 3] [--models gpt3-13b ...] [--methods cpsat dp uniform]
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
from pathlib import Path

from haap_milp.bench import parse_spec, read_rows, run_bench
from haap_milp.bench.report import num
from haap_milp.bench.run import row_key, spec_keys

log = logging.getLogger("solve_scaling")
RESULTS = Path(__file__).resolve().parent / "results"
TYPES = ("h100-80g", "a100-80g", "a100-40g")
MODELS = ("gpt3-13b", "llama3-70b", "llama3-405b")
GPUS = (16, 64, 256, 1024, 4096)
GBS, SEQ = 2048, 4096
COLUMNS = ("model", "layers", "gpus", "types", "cluster", "status", "gap_pct", "cpsat_s", "presolve_s", "dp_s",
           "total_s", "objective_s", "bound_s", "dp_objective_s", "uniform_objective_s", "gain_vs_dp_pct",
           "gain_vs_uniform_pct", "stages", "message")


def scaling_cluster(num_gpus: int, num_types: int) -> str:
    """Cluster shorthand with ``num_gpus`` GPUs of the first ``num_types`` TYPES, split in whole nodes."""
    node = 8 if num_gpus // 8 >= num_types else 4
    nodes = num_gpus // node
    if nodes < num_types or nodes * node != num_gpus:
        raise ValueError(f"{num_gpus} GPUs cannot be split into {num_types} types of whole nodes")
    parts = [nodes // num_types + (i < nodes % num_types) for i in range(num_types)]
    return ",".join(f"{t}:{n * node}" + ("" if node == 8 else f"/{node}") for t, n in zip(TYPES, parts))


def make_spec(args) -> dict:
    clusters = [{"label": f"{g}x{k}", "cluster": scaling_cluster(g, k)} for g in args.gpus for k in args.types]
    return {"name": "solve_scaling", "description": __doc__.split("\n\n")[0], "methods": args.methods,
            "time_limits_s": [args.time_limit], "gbs": [GBS], "seq": [SEQ], "threads": args.threads,
            "models": args.models, "clusters": clusters}


def condense(rows: list[dict], exact: str) -> list[dict]:
    """One line per instance from the bench rows (exact method, DP, uniform)."""
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["cluster"]), {})[r["method"]] = r
    out = []
    for (model, label), ms in by.items():
        ex, dp, uni = ms.get(exact, {}), ms.get("dp", {}), ms.get("uniform", {})
        any_row = ex or dp or uni
        t, t_dp, t_uni = num(ex.get("objective_s")), num(dp.get("objective_s")), num(uni.get("objective_s"))
        parts = [num(any_row.get("presolve_s")), num(dp.get("wall_s")), num(ex.get("wall_s"))]
        gpus, types = label.split("x")
        out.append({
            "model": model, "layers": any_row.get("model_layers", ""), "gpus": int(gpus), "types": int(types),
            "cluster": label, "status": ex.get("status", ""), "gap_pct": _r(num(ex.get("gap")), 100),
            "cpsat_s": _r(parts[2]), "presolve_s": _r(parts[0]), "dp_s": _r(parts[1]),
            "total_s": _r(sum(p for p in parts if p is not None)) if parts[2] is not None else "",
            "objective_s": _r(t), "bound_s": _r(num(ex.get("bound_s"))), "dp_objective_s": _r(t_dp),
            "uniform_objective_s": _r(t_uni), "gain_vs_dp_pct": _r(t_dp / t - 1, 100) if t and t_dp else "",
            "gain_vs_uniform_pct": _r(t_uni / t - 1, 100) if t and t_uni else "", "stages": ex.get("stages", ""),
            "message": ex.get("message", "") or dp.get("message", "")})
    order = {m: i for i, m in enumerate(MODELS)}
    return sorted(out, key=lambda r: (order.get(r["model"], 9), r["gpus"], r["types"]))


def _r(x, scale=1.0):
    return "" if x is None else round(x * scale, 4)


def targets(lines: list[dict]) -> list[str]:
    """The issue's targets, checked against the measured rows."""
    out = []
    for gpus, limit in ((1024, 10.0), (4096, 60.0)):
        for r in (r for r in lines if r["gpus"] == gpus and r["types"] == 3 and r["layers"] in ("80", 80)):
            ok = r["status"] == "OPTIMAL" and r["gap_pct"] != "" and r["gap_pct"] <= 1.0 and r["total_s"] != "" \
                and r["total_s"] <= limit
            out.append(f"- {r['model']} on {gpus} GPUs x 3 types: target gap <= 1 % within {limit:g} s -> "
                       f"{'MET' if ok else 'NOT MET'} (status {r['status'] or '-'}, gap {_cell('gap_pct', r['gap_pct'])} %, "
                       f"CP-SAT {_cell('cpsat_s', r['cpsat_s'])} s, end to end {_cell('total_s', r['total_s'])} s).")
    return out or ["- the target instances (80 layers, 3 types, 1024/4096 GPUs) were not in this run."]


FORMATS = {"gap_pct": ".2f", "cpsat_s": ".2f", "presolve_s": ".2f", "dp_s": ".2f", "total_s": ".2f",
           "objective_s": ".3f", "dp_objective_s": ".3f", "uniform_objective_s": ".3f", "gain_vs_dp_pct": "+.1f",
           "gain_vs_uniform_pct": "+.1f"}


def _cell(key: str, value) -> str:
    return "–" if value == "" else format(value, FORMATS[key]) if key in FORMATS else str(value)


def write_md(lines: list[dict], path: Path, args) -> None:
    head = ["model", "layers", "GPUs", "types", "status", "gap %", "CP-SAT s", "presolve s", "DP s", "total s",
            "T s", "DP T s", "uniform T s", "vs DP %", "vs uniform %", "stages"]
    keys = ["model", "layers", "gpus", "types", "status", "gap_pct", "cpsat_s", "presolve_s", "dp_s", "total_s",
            "objective_s", "dp_objective_s", "uniform_objective_s", "gain_vs_dp_pct", "gain_vs_uniform_pct", "stages"]
    exact = next((m for m in args.methods if m in ("cpsat", "milp")), "none")
    setup = (f"Global batch {GBS} sequences of {SEQ} tokens, bf16; exact method {exact} with a "
             f"{args.time_limit:g} s limit, {args.threads} thread(s), {args.workers} worker process(es) side by "
             "side; stop at 1 % proven gap. 'total s' = presolve + DP warm start + exact solve. vs DP / vs "
             "uniform = T_base / T_exact − 1 (throughput gain).")
    md = ["# Solve-time scaling", "", __doc__.split("Usage:")[0].strip(), "", setup, "", "## Targets", "",
          *targets(lines), "", "## Results", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(_cell(k, r[k]) for k in keys) + " |" for r in lines]
    notes = [f"- {r['model']} {r['cluster']}: {r['message']}" for r in lines if r["message"]]
    md += ["", "## Messages", "", *(notes or ["- none"]), ""]
    path.write_text("\n".join(md))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--gpus", type=int, nargs="+", default=list(GPUS))
    ap.add_argument("--types", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--methods", nargs="+", default=["cpsat", "dp", "uniform"])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-resume", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    spec = parse_spec(make_spec(args), source="solve_scaling")
    work = args.out / "solve_scaling_runs"

    def progress(done: int, total: int, note: str) -> None:
        log.info("[%d/%d] %s", done, total, note)

    res = run_bench(spec, work, workers=args.workers, resume=not args.no_resume, progress=progress)
    exact = next((m for m in args.methods if m in ("cpsat", "milp")), "cpsat")
    keys = spec_keys(spec)
    lines = condense([r for r in read_rows(work / "results.csv") if row_key(r) in keys], exact)
    with (args.out / "solve_scaling.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(lines)
    write_md(lines, args.out / "solve_scaling.md", args)
    log.info("%d runs, %d skipped, %.0f s; wrote %s and %s", res.runs_done, res.runs_skipped, res.wall_s,
                 args.out / "solve_scaling.csv", args.out / "solve_scaling.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
