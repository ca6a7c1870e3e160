"""Gain of the ZeRO-stage search (formulations/ eq. Z1, ``--zero auto``) over the search without it (the runtime's
one stage), and its cost in solve time: CP-SAT, same time limit, 2 threads. Writes a markdown table to stdout.

Run:  python benchmarks/zero_search.py [time_limit_s] > /tmp/zero.md
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


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
