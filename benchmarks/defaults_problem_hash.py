"""Issue #15 defaults: hash the Problem presolve builds for the default grid's instances (benchmarks/specs/
default.yaml, seq 4096) as a plain CLI `solve` builds it (no dimension
flag: SolveOptions vpp/cp/zero "default", eqs. D1-D3; on code older than the defaults, which rejects "default",
the old defaults apply), so the Problem can be compared before
and after a change of defaults. Prints one line per instance: model, cluster, options, variants, vpp>1
variants, cp>1 options, zero-searched options, sha256 of the pickled Problem (first 16 hex digits).

Usage: python benchmarks/defaults_problem_hash.py [SECONDS_BUDGET]   (instances in grid order until the budget)
"""

from __future__ import annotations

import hashlib
import pickle
import sys
import time
from pathlib import Path

import yaml

from haap_milp.catalog.loaders import load_cluster, load_model
from haap_milp.presolve import build
from haap_milp.specs import SolveOptions, TrainingSpec


def problem_line(model: str, cluster: str, gbs: int, seq: int, engine: str = "megatron") -> str:
    m, c = load_model(model), load_cluster(cluster)
    training = TrainingSpec(global_batch_size=gbs, seq_len=seq, engine=engine)
    try:
        opts = SolveOptions(time_limit_s=10, threads=2, vpp="default", cp="default", zero="default")
    except ValueError:  # before eqs. D1-D3: the old defaults (vpp 1, cp 1, the runtime's ZeRO)
        opts = SolveOptions(time_limit_s=10, threads=2)
    p = build(m, c, training, opts).problem
    digest = hashlib.sha256(pickle.dumps(p)).hexdigest()[:16]
    return (f"{model} {cluster} gbs={gbs} seq={seq} engine={engine} options={len(p.options)} "
            f"variants={len(p.variants)} vpp>1={sum(v.vpp > 1 for v in p.variants)} "
            f"cp>1={sum(o.cp > 1 for o in p.options)} zero={sorted({str(o.zero) for o in p.options})} "
            f"max_stages={p.max_stages} sha={digest}")


def main() -> None:
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 600.0
    spec = yaml.safe_load(Path("benchmarks/specs/default.yaml").read_text())
    t0 = time.perf_counter()
    for c in spec["clusters"]:
        for mm in spec["models"]:
            if time.perf_counter() - t0 > budget:
                print("budget spent", flush=True)
                return
            print(problem_line(mm["name"], c["cluster"], mm["gbs"][0], spec["seq"][0]), flush=True)


if __name__ == "__main__":
    main()
