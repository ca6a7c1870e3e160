"""Per (GPU type, tp, micro-batch): haap's analytic fp32 decoder-layer time against the measured OPT-350M profile.

Inputs (in the repo, MIT, see their LICENSE files): tests/data/profiles/OPT-350 (Metis format, measured forward +
backward of one decoder layer, TP all-reduces included) and tests/data/sailor_network (Sailor's measured network:
``multizone_bandwidths_het.json`` between VMs, ``intra_node_bandwidths.json`` one GPU's stream inside a 4-GPU VM).
Runtime as in benchmarks/sailor_fig8b.py: fp32, DeepSpeed (TP all-reduces exposed), no recompute, seq 2048.
Two analytic columns: the TP ring on the datasheet NVLink (x calibrated efficiency; no intra-node figures) and on
the measured intra-node streams (read at the ring's step size M / tp: Hardware.tp_ring_step); the last column
also turns sequence parallelism off (haap's default is on; the measured Megatron-DeepSpeed runs had none, so their
norms, dropouts and residuals run on the whole sequence on every tp rank).

    python benchmarks/fp32_tp_analytic_vs_profile.py [--out benchmarks/results/fp32_tp_analytic_vs_profile.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from haap_milp.catalog import load_cluster, load_model
from haap_milp.estimator import Estimator
from haap_milp.network import sailor
from haap_milp.network.merge import with_network
from haap_milp.network.spec import MeasuredNetwork
from haap_milp.specs import TrainingSpec

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "tests" / "data" / "profiles" / "OPT-350"
NET = ROOT / "tests" / "data" / "sailor_network"
DEVICES = {"A100": "a100-40g", "V100": "v100-16g"}
LEFT_OUT = {n: "none" for n in ("A100-80", "GH-96", "RTX-2080", "Titan-RTX", "RTX-3090")}


def estimator(intra: bool, sp: bool = True) -> Estimator:
    links = sailor.import_links(NET / "multizone_bandwidths_het.json", "us-central1-a", {})
    if intra:
        links = links + sailor.import_links(NET / "intra_node_bandwidths.json", "us-central1-a", LEFT_OUT)
    cluster = with_network(load_cluster("a100-40g:32/4,v100-16g:96/4"), MeasuredNetwork(links=tuple(links)))
    training = TrainingSpec(global_batch_size=1024, seq_len=2048, precision="fp32", engine="deepspeed",
                            distributed_optimizer=False, recompute_modes=("none",), sequence_parallel=sp)
    return Estimator(load_model("opt-350m"), cluster, training)


def measured_ms(gpu: str, tp: int, mbs: int) -> float | None:
    """One decoder layer (index 2; 0 is the embedding, 1 the first layer with its warm-up) of the profile."""
    f = PROFILE / f"DeviceType.{gpu}_tp{tp}_bs{mbs}.json"
    return json.loads(f.read_text())["execution_time"]["layer_compute_total_ms"][2] if f.exists() else None


def rows() -> list[dict]:
    nvlink, intra, no_sp = estimator(False), estimator(True), estimator(True, sp=False)
    out = []
    for gpu, name in DEVICES.items():
        for tp in (1, 2, 4):
            for mbs in (1, 2, 4, 8):
                m = measured_ms(gpu, tp, mbs)
                if m is None:
                    continue
                a = nvlink.layer_cost(name, tp, 1, 1, 1, "none", mbs)
                b = intra.layer_cost(name, tp, 1, 1, 1, "none", mbs)
                c = no_sp.layer_cost(name, tp, 1, 1, 1, "none", mbs)
                out.append({"gpu": name, "tp": tp, "mbs": mbs, "measured_ms": m, "compute_ms": b.compute_s * 1e3,
                            "tp_nvlink_ms": a.tp_comm_s * 1e3, "tp_intra_ms": b.tp_comm_s * 1e3,
                            "nvlink_ratio": a.time_s * 1e3 / m, "intra_ratio": b.time_s * 1e3 / m,
                            "no_sp_ratio": c.time_s * 1e3 / m})
    return out


def table(rs: list[dict]) -> list[str]:
    lines = [("| GPU | tp | mbs | measured ms | analytic compute ms | TP all-reduce ms (datasheet NVLink) | "
              "TP all-reduce ms (measured intra-VM) | analytic / measured (NVLink) | analytic / measured (intra-VM) | "
              "analytic / measured (intra-VM, no SP) |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['gpu']} | {r['tp']} | {r['mbs']} | {r['measured_ms']:.2f} | {r['compute_ms']:.2f} | "
                     f"{r['tp_nvlink_ms']:.2f} | {r['tp_intra_ms']:.2f} | {r['nvlink_ratio']:.2f} | {r['intra_ratio']:.2f} | "
                     f"{r['no_sp_ratio']:.2f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fp32_tp_analytic_vs_profile.md")
    args = ap.parse_args()
    rs = rows()
    head = ["# fp32 decoder layer of OPT-350M: analytic vs measured profile, per (GPU, tp, micro-batch)", "",
            "Produced by `python benchmarks/fp32_tp_analytic_vs_profile.py` (inputs and runtime: its docstring).",
            "Times are forward + backward of one decoder layer on one GPU of the tp group, one micro-batch, ms.", "",
            "What was missing at tp > 1: the cluster spec (`v100-16g:96/4`) prices the TP ring on the datasheet NVLink",
            "(V100 SXM2: 150 GB/s per direction x the calibrated efficiency), but Sailor measured one GPU's stream",
            "inside these 4-GPU GCP VMs at 68 GB/s at best (V100, 4 senders) and about 37 GB/s at the 4 MB each",
            "ring step of a micro-batch-2 all-reduce sends (A100-40GB: 243 GB/s at best, about 49 GB/s at 2 MB).",
            "With that file imported, the ring's 2(tp-1) steps are priced on that stream at the step size M / tp",
            "(Thakur et al. 2005; the rule the DP ring already follows), and tp 2 / tp 4 come within a few points of",
            "tp 1's ratio (which is the remaining compute-side bias: 0.82-0.89). A100 tp 4 at micro-batch 1-2",
            "stays low (0.73-0.81): about 2 ms per layer of fixed cost the measured bandwidths do not explain.", ""]
    args.out.write_text("\n".join(head + table(rs)) + "\n", encoding="utf-8")
    print("\n".join(table(rs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
