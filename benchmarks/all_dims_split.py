"""Where a solve with every dimension on spends its time: presolve, the DP heuristic, the warm-started exact search
(API, one after the other as the planner runs them; wall and CPU seconds of this process, options and variants kept,
DP variants skipped by eq. DP8f, exact status, nodes). benchmarks/results/search_dimensions.md, "Re-run on the
refitted estimator", ran it on the 9 all-on instances before and after formulations/ eqs. O1f-S2f and DP8f.

    python benchmarks/all_dims_split.py MODEL CLUSTER GBS SEQ [EXACT_LIMIT_S]   # e.g. mixtral-8x7b h100-80g:16 1024 4096 20
"""
import sys
import time

from haap_milp import planner
from haap_milp.catalog import load_cluster, load_model
from haap_milp.specs import SolveOptions, TrainingSpec

model, cluster, gbs, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
limit = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0
m, c = load_model(model), load_cluster(cluster)
tr = TrainingSpec(global_batch_size=gbs, seq_len=seq)
opts = SolveOptions(time_limit_s=limit, threads=2, solver="cpsat", vpp="auto", zero="auto", cp="auto", etp="auto",
                    mixed_stages="on")


def clock():
    return time.perf_counter(), time.process_time()


w, p = clock(); ctx = planner.Context.build(m, c, tr, opts); w1, p1 = clock()
st = ctx.presolved.stats
print(f"presolve wall {w1-w:.2f} cpu {p1-p:.2f} kept {st['options_kept']} variants {st['variants_kept']}")
w, p = clock(); dp, _ = planner.run_method(ctx, "dp"); w1, p1 = clock()
print(f"dp wall {w1-w:.2f} cpu {p1-p:.2f} obj {dp.objective_s} splits {dp.stats.get('splits')} skipped {dp.stats.get('variants_skipped_by_bound')}")
w, p = clock(); ex, keep = planner.run_method(ctx, "cpsat", dp); w1, p1 = clock()
print(f"exact wall {w1-w:.2f} cpu {p1-p:.2f} {ex.status} obj {ex.objective_s} bound {ex.bound_s} kept_variants {len(keep)} "
      + " ".join(f"{k}={v}" for k, v in ex.stats.items() if isinstance(v, (int, float)) and k in ("nodes", "nodes_explored", "dp_runs", "variants_searched")))
