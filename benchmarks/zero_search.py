"""Gain of the ZeRO-stage search (formulations/ eq. Z1, ``--zero auto``) over the search without it (the runtime's
one stage), and its cost in solve time: CP-SAT, same time limit, 2 threads. Writes a markdown table to stdout.

Run:  python benchmarks/zero_search.py [time_limit_s] > /tmp/zero.md
      python benchmarks/zero_search.py case   (the torchtitan case: FSDP-only runtime, memory-tight A100-40GB)
Sets: a subset of the default grid (benchmarks/specs/default.yaml: 3 models x 3 clusters, gbs as there) under the
megatron runtime (search set {0, 1}) and the fsdp runtime (search set {0, 1, 2, 3}); a long-context set
(seq 32k-128k); an MoE set.
"""

from __future__ import annotations

import sys
import time

from haap_milp import planner
from haap_milp.catalog import load_cluster, load_model
from haap_milp.specs import SolveOptions, TrainingSpec

DEFAULT = [(m, gbs, c) for m, gbs in (("gpt3-1.3b", 512), ("llama3-8b", 512), ("llama3-70b", 1024))
           for c in ("h100-80g:16", "h100-80g:32,a100-80g:32", "a100-80g:32,a100-40g:32")]
LONG = [("llama3-8b", 64, "h100-80g:32,a100-80g:32", 32768), ("llama3-8b", 32, "h100-80g:32,a100-80g:32", 131072),
        ("llama3-70b", 32, "h100-80g:32,a100-80g:32", 32768)]
MOE = [("mixtral-8x7b", 1024, "h100-80g:32,a100-80g:32"), ("mixtral-8x7b", 1024, "a100-80g:32,a100-40g:32")]


def run(model, cluster, gbs, seq, engine, zero, limit):
    t = TrainingSpec(global_batch_size=gbs, seq_len=seq, engine=engine)
    t0 = time.perf_counter()
    out = planner.solve(load_model(model), load_cluster(cluster), t,
                        SolveOptions(time_limit_s=limit, threads=2, zero=zero))
    r = out.result
    zs = sorted({s.zero for s in r.plan.stages if s.zero is not None}) if r.plan else []
    return r.objective_s, time.perf_counter() - t0, r.status.value, zs


def row(label, model, cluster, gbs, seq, engine, limit):
    base = run(model, cluster, gbs, seq, engine, None, limit)
    z = run(model, cluster, gbs, seq, engine, "auto", limit)
    gain = (base[0] / z[0] - 1) * 100 if base[0] and z[0] else None
    fmt = lambda x: "-" if x is None else f"{x:.3f}"
    print(f"| {label} | {model} | {cluster} | {gbs} | {seq} | {engine} | {fmt(base[0])} ({base[2]}) | "
          f"{fmt(z[0])} ({z[2]}) | {'-' if gain is None else f'{gain:+.1f} %'} | {','.join(map(str, z[3]))} | "
          f"{base[1]:.1f} | {z[1]:.1f} |", flush=True)


def main(limit: float) -> None:
    print("| set | model | cluster | gbs | seq | runtime | T without (s) | T with --zero auto (s) | gain | ZeRO chosen "
          "| solve s without | solve s with |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for engine in ("megatron", "fsdp"):
        for m, gbs, c in DEFAULT:
            row("default", m, c, gbs, 4096, engine, limit)
    for m, gbs, c, seq in LONG:
        for engine in ("megatron", "fsdp"):
            row("long-context", m, c, gbs, seq, engine, limit)
    for m, gbs, c in MOE:
        for engine in ("megatron", "fsdp"):
            row("MoE", m, c, gbs, 4096, engine, limit)


def torchtitan_case() -> None:
    """llama2-13b on 16 A100-40GB under torchtitan (FSDP2 runtime, single-stage search as torchtitan runs ZeRO-2/3
    only without pipelining): ZeRO-0 (replicate, what the search has without the dimension's sharding) against
    --zero auto; the emitted config is parsed by torchtitan's own ConfigManager when torchtitan is installed."""
    m, c = load_model("llama2-13b"), load_cluster("a100-40g:16")
    t = TrainingSpec(global_batch_size=64, seq_len=4096, engine="fsdp")
    for z in ((0,), "auto"):
        out = planner.solve(m, c, t, SolveOptions(target="torchtitan", max_stages=1, zero=z, time_limit_s=30))
        s = out.result.plan.stages[0]
        print(f"| --zero {z if z == 'auto' else z[0]} | {out.result.objective_s:.3f} | tp {s.tp} dp {s.dp} ZeRO {s.zero} "
              f"recompute {s.recompute} | {s.memory_gib:.1f} GiB | {out.violations or 'none'} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "case":
        torchtitan_case()
    else:
        main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
