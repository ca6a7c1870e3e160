"""Recompute expected.json of every spec-level reference instance by brute force on the presolved
problem (run after a cost-model or calibration.json change and review the diff).

    python formulations/instances/regenerate.py

Only the spec-level instances (``<name>/instance.yaml``) move with the cost model. The pinned
Problem-level instances (``problems/*.json``) do not, and are not rewritten here: see
problems/generate.py and README.md.
"""

from __future__ import annotations

import json
import pathlib

import yaml

from haap_milp import planner
from haap_milp.catalog import load_cluster, load_model
from haap_milp.specs import SolveOptions, TrainingSpec

HERE = pathlib.Path(__file__).parent


def load(case: pathlib.Path):
    spec = yaml.safe_load((case / "instance.yaml").read_text())
    return (load_model(spec["model"]), load_cluster(spec["cluster"]), TrainingSpec(**spec["training"]),
            SolveOptions(**spec["options"]))


def solve_brute(case: pathlib.Path) -> dict:
    model, cluster, training, options = load(case)
    ctx = planner.Context.build(model, cluster, training, options)
    raw, _ = planner.run_method(ctx, "brute")
    out = planner.finish(ctx, raw)
    plan = out.result.plan
    return {"status": raw.status, "objective_s": raw.objective_s,
            "stages": [{"num_layers": s.num_layers, "gpu_type": s.gpu_type, "tp": s.tp, "dp": s.dp,
                        "recompute": s.recompute} for s in plan.stages] if plan else [],
            "samples_per_microbatch": plan.samples_per_microbatch if plan else None}


if __name__ == "__main__":
    for case in sorted(p for p in HERE.iterdir() if (p / "instance.yaml").exists()):
        (case / "expected.json").write_text(json.dumps(solve_brute(case), indent=2) + "\n")
        print(case.name, (case / "expected.json").read_text())
