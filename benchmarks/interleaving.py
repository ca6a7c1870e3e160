"""What searching interleaved 1F1B (``--vpp auto``, formulations/ eqs. I1-I5) gains over the search without it.

Run: ``.venv/bin/python benchmarks/interleaving.py [--sets default deep moe] [--limit 10] [--out FILE.json]``.
Each task is solved twice by the planner (``planner.solve``, CP-SAT, 2 threads, the same time limit, target
any, default runtime): ``--vpp 1`` and ``--vpp auto``; it records the predicted iteration time, the proven
gap, the wall time and the plan's vpp and stage count. Sets: ``default`` the (model, cluster, gbs) grid of
benchmarks/specs/default.yaml; ``deep`` small global batches (few micro-batches per stage) on deep
pipelines; ``moe`` MoE models at the default and a small batch. Writes JSON; ``--md`` renders it as the
"Interleaving" section of benchmarks/results/search_dimensions.md. Not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from haap_milp import planner
from haap_milp.catalog.loaders import load_cluster, load_model
from haap_milp.specs import SolveOptions, TrainingSpec


def default_tasks() -> list[tuple[str, str, str, int]]:
    spec = yaml.safe_load((ROOT / "benchmarks" / "specs" / "default.yaml").read_text())
    # clusters outer (smallest first), so a partial run covers every model on the smaller clusters
    return [(c["label"], m["name"], c["cluster"], m["gbs"][0]) for c in spec["clusters"] for m in spec["models"]]


DEEP = [  # (cluster label, model, cluster, gbs): a batch of a few micro-batches per stage
    ("h100+a100-64", "llama3-70b", "h100-80g:32,a100-80g:32", 32),
    ("a100-80g+40g-64", "llama3-70b", "a100-80g:32,a100-40g:32", 32),
    ("a100-80g+40g-64", "gpt3-13b", "a100-80g:32,a100-40g:32", 16),
    ("3types-256", "llama3-405b", "h100-80g:64,a100-80g:128,a100-40g:64", 64),
    ("3types-256", "llama3-70b", "h100-80g:64,a100-80g:128,a100-40g:64", 32),
    ("a100-40g-64", "llama3-70b", "a100-40g:64", 16),
]
MOE = [
    ("h100+a100-64", "mixtral-8x7b", "h100-80g:32,a100-80g:32", 1024),
    ("h100+a100-64", "mixtral-8x7b", "h100-80g:32,a100-80g:32", 64),
    ("3types-256", "qwen3-235b-a22b", "h100-80g:64,a100-80g:128,a100-40g:64", 2048),
    ("3types-256", "qwen3-235b-a22b", "h100-80g:64,a100-80g:128,a100-40g:64", 128),
    ("a100-80g+40g-64", "mixtral-8x7b", "a100-80g:32,a100-40g:32", 64),
]


def run(label, model, cluster, gbs, vpp, limit) -> dict:
    m, c = load_model(model), load_cluster(cluster)
    tr = TrainingSpec(global_batch_size=gbs, seq_len=4096)
    opts = SolveOptions(time_limit_s=limit, threads=2, vpp=vpp)
    t0 = time.perf_counter()
    out = planner.solve(m, c, tr, opts)
    wall = time.perf_counter() - t0
    r = out.result
    plan = r.plan
    return {"cluster": label, "model": model, "gbs": gbs, "vpp_flag": vpp, "status": r.status,
            "time_s": r.objective_s, "gap": r.gap, "wall_s": round(wall, 2),
            "vpp": plan.vpp if plan else None, "pp": plan.pp if plan else None,
            "num_microbatches": plan.num_microbatches if plan else None,
            "variants": out.presolved.stats.get("variants_kept") if out.presolved else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", nargs="+", default=["deep", "moe", "default"])
    ap.add_argument("--limit", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "interleaving.json")
    ap.add_argument("--md", type=Path, help="render --out as markdown into this file's Interleaving section")
    args = ap.parse_args(argv)
    if args.md:
        return render(json.loads(args.out.read_text()), args.md)
    sets = {"default": default_tasks(), "deep": DEEP, "moe": MOE}
    rows = json.loads(args.out.read_text()) if args.out.exists() else []
    done = {(r["set"], r["cluster"], r["model"], r["gbs"], str(r["vpp_flag"])) for r in rows}
    for name in args.sets:
        for task in sets[name]:
            for vpp in (1, "auto"):
                if (name, task[0], task[1], task[3], str(vpp)) in done:
                    continue
                row = {"set": name, **run(*task, vpp, args.limit), "limit_s": args.limit}
                rows.append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def table(rows: list[dict]) -> list[str]:
    """Markdown rows: one line per task with both runs (vpp 1 and auto)."""
    pairs: dict = {}
    for r in rows:
        pairs.setdefault((r["set"], r["cluster"], r["model"], r["gbs"]), {})[str(r["vpp_flag"])] = r
    out = [("| set | cluster | model | gbs | T vpp 1 (s) | T auto (s) | T change | plan (auto) | gap 1 / auto | "
           "wall 1 / auto (s) | variants 1 / auto |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (st, cl, mo, gbs), d in pairs.items():
        a, b = d.get("1"), d.get("auto")
        if not a or not b or a["time_s"] is None or b["time_s"] is None:
            continue
        change = b["time_s"] / a["time_s"] - 1
        plan = f"vpp {b['vpp']}, P {b['pp']}, M {b['num_microbatches']}" if b["vpp"] and b["vpp"] > 1 else \
            f"vpp 1, P {b['pp']}"
        out.append(f"| {st} | {cl} | {mo} | {gbs} | {a['time_s']:.4g} | {b['time_s']:.4g} | {change:+.1%} | {plan} | "
                   f"{a['gap']:.1%} / {b['gap']:.1%} | {a['wall_s']:.0f} / {b['wall_s']:.0f} | "
                   f"{a['variants']} / {b['variants']} |")
    return out


def summary(rows: list[dict], name: str) -> str:
    pairs: dict = {}
    for r in rows:
        if r["set"] == name:
            pairs.setdefault((r["cluster"], r["model"], r["gbs"]), {})[str(r["vpp_flag"])] = r
    done = [(d["1"], d["auto"]) for d in pairs.values() if "1" in d and "auto" in d and d["1"]["time_s"]
            and d["auto"]["time_s"]]
    if not done:
        return f"{name}: no task finished"
    ch = [b["time_s"] / a["time_s"] - 1 for a, b in done]
    wall = [b["wall_s"] / a["wall_s"] for a, b in done]
    used = sum(1 for _, b in done if b["vpp"] and b["vpp"] > 1)
    return (f"{name}: {len(done)} tasks; vpp > 1 chosen in {used}; iteration time change with --vpp auto: mean "
            f"{sum(ch) / len(ch):+.1%}, best {min(ch):+.1%}, worst {max(ch):+.1%}; wall time ratio auto / 1: mean "
            f"{sum(wall) / len(wall):.2f}x, max {max(wall):.2f}x")


def render(rows: list[dict], md: Path) -> int:
    """Print the tables and summaries (pasted into benchmarks/results/search_dimensions.md)."""
    for name in ("default", "deep", "moe"):
        print(summary(rows, name))
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
