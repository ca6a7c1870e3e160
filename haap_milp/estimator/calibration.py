"""Efficiency parameters per GPU type, fitted by ``benchmarks/calibrate.py`` (file ``calibration.json``).

Every number the time model multiplies by is here, with where it comes from:

* ``fitted``   - least-squares fit on the published measured runs (benchmarks/data/measured_runs.json);
* ``prior``    - a stated value from a public source (given in ``PRIOR_SOURCES``), used where the
  measured runs cannot identify the parameter;
* ``derived``  - a GPU type without measured runs takes the parameters of a fitted type by the rule
  in ``derive_params`` (same architecture family first, else nearest machine balance).

Efficiencies are fractions of the GPU's *own* datasheet peak (FLOP/s, HBM GB/s, link GB/s), so copying
them to another GPU scales every time by that GPU's own specs.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from typing import Any

from haap_milp.errors import HaapInputError
from haap_milp.specs import GPUSpec

log = logging.getLogger(__name__)

PRIOR_SOURCES = {
    "hbm_eff": "achievable/peak HBM bandwidth of streaming kernels (BabelStream/STREAM triad on A100/H100 "
    "reach ~85-92% of datasheet bandwidth; unfused PyTorch elementwise ops less): 0.80",
    "kernel_latency_s": "per-kernel fixed cost (launch + prologue/epilogue + tail wave): NVIDIA Matrix "
    "Multiplication Background guide (DU-09799-001) ch. 3 tile/wave quantization; CUDA launch latency "
    "~3-5 us; fitted where the runs identify it",
    "nvlink_eff": "nccl-tests all_reduce_perf bus bandwidth / per-direction NVLink bandwidth on DGX A100 "
    "(~230 of 300 GB/s) and DGX H100 (~360-370 of 450 GB/s): 0.78",
    "nic_eff": "nccl-tests multi-node bus bandwidth / NIC line rate on HDR/NDR InfiniBand (~0.85-0.92): 0.85",
    "link_latency_s": "NCCL ring step latency, small-message all_reduce_perf on NVLink (~1 us per step) "
    "and IB (~5 us per step, NodeGroup.nic_latency_us)",
    "dp_overlap": "fraction of the DP gradient reduce-scatter/all-reduce hidden behind backward "
    "(Megatron --overlap-grad-reduce): fitted (global)",
    "tp_overlap": "fraction of TP communication hidden behind GEMMs (Megatron/TE --tp-comm-overlap): "
    "fitted (global)",
    "ep_overlap": "fraction of EP all-to-all hidden (1F1B EP-A2A overlap in recent Megatron-Core MoE); "
    "prior 0.0 (conservative: most measured MoE runs do not state it)",
    "moe_latency_s": "fixed cost per MoE layer and pass (router top-k, the device-to-host sync of dropless "
    "token counts, permutation index build): fitted on the MoE rows",
    "grouped_gemm_eff": "efficiency of the grouped expert GEMMs (incl. residual routing imbalance) relative to "
    "dense GEMMs of the same shape: fitted on the MoE rows",
    "grouped_m_half": "tokens per expert at which the grouped expert GEMMs run at half their asymptotic "
    "efficiency (tile / wave quantization and per-expert prologue; compute.grouped_gemm_fwd_bwd_s): fitted on "
    "the MoE rows (Hopper), 0 (no shape effect) where no MoE rows exist",
    "expert_latency_s": "fixed cost per local expert and per-expert launch of the grouped expert GEMMs, beyond a "
    "GEMM's own kernel cost: Transformer Engine's GroupedLinear splits the permuted tokens and runs (and in fp8 "
    "quantizes) expert by expert, so each local expert adds host dispatch and small kernels (Megatron-Bridge 'MoE "
    "Training Optimization': compute-efficiency wall = small expert GEMMs + host overhead; fp8 shifts cost to "
    "quantization kernels and host overhead): fitted on the Hopper MoE rows; 0 where no MoE rows exist",
    "fp8_pair_s": "fp8 only: seconds per routed token-expert pair and per quantized expert-GEMM input (forward: the "
    "permuted input; backward: the output gradient), independent of the row width. Fitted on the Hopper fp8 MoE rows "
    "(Qwen3-30B-A3B x 2, Qwen3-235B-A22B x 3, DeepSeek-V3 x 1); the kernel-level mechanism is not identified. The "
    "form is what those rows support: the two Qwen3-30B rows take the same time per token at 2,048 and 4,096 tokens "
    "per expert (a per-expert fixed cost would halve per token), and Qwen3-30B (32,768 pairs of width 2,048 per GPU) "
    "is slower per token than Qwen3-235B (16,384 pairs of width 4,096): equal bytes, twice the pairs. 0 where no "
    "fp8 MoE rows exist",
    "overlap_slowdown": "eq. Z4b: compute slowed per second of an overlapped FSDP / ZeRO-2/3 collective (NCCL "
    "kernels take SMs and HBM bandwidth from the GEMMs they overlap): per micro-batch max(c, m) + k·min(c, m). "
    "Fitted (global) on the PyTorch-FSDP-family rows (torchtitan, llm-foundry, MaxText); Megatron-FSDP's one row is "
    "priced without it (measured_runs.fsdp_time_s)",
    "frag_fraction": "caching-allocator fragmentation as a share of the largest single allocation "
    "(memory.fragmentation_bytes): least squares on the torchtitan peak-memory rows whose recomputation maps "
    "onto haap's (benchmarks/calibrate.py); 0 without a fit",
    "overhead_gib": "CUDA context + NCCL communicator buffers + cuBLAS/TE workspaces + allocator "
    "fragmentation reserve; 3.0 GiB (PyTorch CUDA context ~0.5-1 GiB; NCCL buffers ~0.5-1 GiB "
    "(NCCL_BUFFSIZE 4 MiB x channels x peers); caching-allocator fragmentation 5-15% per the "
    "torchtitan memory notes in the project's data README); checked against the torchtitan "
    "memory rows (tests/test_estimator_memory.py)",
}


@dataclass(frozen=True)
class GpuParams:
    """Time-model parameters of one GPU type (fractions of its own datasheet peaks)."""

    gemm_eff_16: float = 0.75  # asymptotic GEMM efficiency at bf16/fp16 (fraction of dense peak)
    gemm_eff_fp8: float = 0.55  # same at fp8 (fraction of the fp8 dense peak)
    attn_eff: float = 0.55  # flash-attention efficiency (fraction of the bf16/fp16 peak)
    kernel_latency_s: float = 6e-6  # fixed cost per kernel (makes small / tp-sharded GEMMs inefficient)
    hbm_eff: float = 0.80
    nvlink_eff: float = 0.78
    nic_eff: float = 0.85
    moe_latency_s: float = 0.0  # fixed cost per MoE layer and pass (router top-k, dropless token-count sync, permute)
    grouped_gemm_eff: float = 1.0  # grouped expert GEMMs (+ routing imbalance) relative to dense GEMMs
    grouped_m_half: float = 0.0  # tokens per expert at which the grouped GEMMs' shape factor m/(m + m_half) is 1/2
    expert_latency_s: float = 0.0  # fixed cost per local expert and per-expert launch (compute.expert_launches)
    fp8_pair_s: float = 0.0  # fp8: seconds per routed token-expert pair and quantized expert-GEMM input (compute.expert_launches)
    source: str = "prior"  # fitted | prior | derived from <gpu> (<rule>)

    def gemm_eff(self, precision: str) -> float:
        return self.gemm_eff_fp8 if precision == "fp8" else self.gemm_eff_16


@dataclass(frozen=True)
class GlobalParams:
    """Parameters shared by all GPU types (framework behaviour, not silicon)."""

    dp_overlap: float = 0.5
    tp_overlap: float = 0.0
    ep_overlap: float = 0.0
    intra_latency_s: float = 1e-6  # per ring step on NVLink
    overhead_gib: float = 3.0  # framework + allocator reserve per GPU
    frag_fraction: float = 0.0  # allocator fragmentation as a share of the largest allocation (memory.py)
    overlap_slowdown: float = 0.0  # compute slowed per second of collective it overlaps (SM/HBM contention)


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters per GPU type + global ones; ``params(gpu)`` derives missing types."""

    gpus: dict[str, GpuParams] = field(default_factory=dict)
    globals: GlobalParams = field(default_factory=GlobalParams)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    balance: dict[str, float] = field(default_factory=dict)  # machine balance of fitted GPUs, FLOP/byte

    def __hash__(self) -> int:  # used as part of cache keys
        return hash((tuple(sorted(self.gpus.items())), self.globals))

    def params(self, gpu: GPUSpec) -> GpuParams:
        """Parameters of ``gpu``: its own fit, else derived (``derive_params``)."""
        if gpu.name in self.gpus:
            return self.gpus[gpu.name]
        return derive_params(gpu, self)


def family(name: str) -> str:
    """Architecture family from a catalog name: 'a100-80g' -> 'a100'; A800 is Ampere, H800/H200/H20 Hopper."""
    head = name.lower().split("-")[0]
    return {"a800": "a100", "h800": "h100", "h200": "h100", "h20": "h100"}.get(head, head)


def machine_balance(gpu: GPUSpec) -> float:
    """Peak 16-bit FLOP per HBM byte (roofline ridge point)."""
    peak = gpu.bf16_tflops or gpu.fp16_tflops or 0.0
    return peak * 1e12 / (gpu.hbm_bandwidth_gbps * 1e9)


def derive_params(gpu: GPUSpec, cal: Calibration) -> GpuParams:
    """Rule for GPU types without measured runs: take a fitted type of the same architecture family
    (a100-40g <- a100-80g, h200-141g <- h100-80g); else the fitted type whose machine balance (peak
    FLOP/byte) is nearest in log scale. Efficiencies are fractions of the GPU's own peaks, so its own
    datasheet FLOP/s, HBM and link bandwidths scale every time. No fitted type at all: the priors."""
    if not cal.gpus:
        return GpuParams(source="prior (no calibration loaded)")
    same = sorted(n for n in cal.gpus if family(n) == family(gpu.name) and not cal.gpus[n].source.startswith("derived"))
    if same:
        base, rule = same[0], "same architecture family"
    else:
        b = machine_balance(gpu)
        fitted = {n: cal.balance.get(n, 0.0) for n in cal.gpus if cal.balance.get(n, 0.0) > 0}
        if not fitted or b <= 0:
            return GpuParams(source="prior (no comparable fitted GPU)")
        base = min(sorted(fitted), key=lambda n: abs(math.log(fitted[n] / b)))
        rule = f"nearest machine balance ({b:.0f} vs {fitted[base]:.0f} FLOP/B)"
    return replace(cal.gpus[base], source=f"derived from {base} ({rule})")


def _from_dict(data: dict[str, Any]) -> Calibration:
    try:
        gpus = {n: GpuParams(**{k: v for k, v in p.items() if k in GpuParams.__dataclass_fields__})
                for n, p in data.get("gpus", {}).items()}
        glob = GlobalParams(**{k: v for k, v in data.get("globals", {}).items() if k in GlobalParams.__dataclass_fields__})
    except TypeError as exc:  # wrong value types in a user file
        raise HaapInputError(f"calibration file has a malformed parameter: {exc}", field="calibration") from exc
    balance = {n: float(p.get("machine_balance", 0.0)) for n, p in data.get("gpus", {}).items()}
    meta = {k: v for k, v in data.items() if k not in ("gpus", "globals")}
    return Calibration(gpus=gpus, globals=glob, meta=meta, balance=balance)


_RANGES = {"grouped_m_half": (0.0, 1e6), "expert_latency_s": (0.0, 1.0), "fp8_pair_s": (0.0, 1.0), "kernel_latency_s": (0.0, 1.0), "moe_latency_s": (0.0, 1.0), "intra_latency_s": (0.0, 1.0),
           "overhead_gib": (0.0, 1024.0), "frag_fraction": (0.0, 4.0), "machine_balance": (0.0, 1e6)}  # else an efficiency/fraction: [0, 1]


def validate_calibration_data(data: Any, name: str) -> dict[str, Any]:
    """A user calibration file's content, checked: a mapping with ``gpus`` (GPU name -> parameters) and/or
    ``globals``; only known parameter names; every value a finite number in its range (efficiencies and
    overlaps 0-1, latencies 0-1 s, overhead 0-1024 GiB). Other top-level keys are kept as metadata."""
    def bad(where: str, value: Any, why: str, shown: str | None = None) -> HaapInputError:
        text = " ".join(repr(value).split())
        text = shown or (text if len(text) <= 60 else text[:57] + "...")  # (whole, or cut with a mark)
        return HaapInputError(f"calibration file {name!r}: {where} = {text}: {why}. A calibration file is what "
                              "benchmarks/calibrate.py writes (haap_milp/estimator/calibration.json).",
                              field="calibration", value=value)

    if not isinstance(data, dict) or not ({"gpus", "globals"} & set(data)):
        keys = sorted(map(str, data)) if isinstance(data, dict) else []
        shown = f"a mapping of {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}" if keys else \
            ("an empty mapping" if isinstance(data, dict) else f"a {type(data).__name__}")
        raise bad("(top level)", data, "needs a mapping with a 'gpus' and/or 'globals' section", shown)
    sections: list[tuple[str, Any, set[str]]] = []
    gpus = data.get("gpus", {})
    if not isinstance(gpus, dict):
        raise bad("gpus", gpus, "must map GPU names to parameter mappings")
    gpu_keys = set(GpuParams.__dataclass_fields__) | {"machine_balance"}
    sections += [(f"gpus.{g}", p, gpu_keys) for g, p in gpus.items()]
    sections.append(("globals", data.get("globals", {}), set(GlobalParams.__dataclass_fields__)))
    for where, params, allowed in sections:
        if not isinstance(params, dict):
            raise bad(where, params, "must be a mapping of parameter names to numbers")
        for key, value in params.items():
            if key not in allowed:
                raise bad(f"{where}.{key}", value, f"unknown parameter; allowed: {', '.join(sorted(allowed))}")
            if key == "source":
                if not isinstance(value, str):
                    raise bad(f"{where}.{key}", value, "must be text")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(f"{where}.{key}", value, "must be a finite number")
            lo, hi = _RANGES.get(key, (0.0, 1.0))
            if not lo <= value <= hi or (key.endswith("_eff") and value <= 0):
                raise bad(f"{where}.{key}", value, f"must be {'above' if key.endswith('_eff') else 'at least'} "
                          f"{lo:g} and at most {hi:g}")
    return data


def load_calibration(path: str | None = None) -> Calibration:
    """The packaged ``calibration.json`` (or a user file at ``path``, checked by ``validate_calibration_data``)."""
    if path is None:
        try:
            text = resources.files("haap_milp.estimator").joinpath("calibration.json").read_text(encoding="utf-8")
        except FileNotFoundError:
            log.warning("no calibration.json in the package; using prior parameters")
            return Calibration()
        return _from_dict(json.loads(text))
    from haap_milp.catalog.files import load_data

    data = validate_calibration_data(load_data(path, "calibration file"), str(path))
    return _from_dict(data)


def to_dict(cal: Calibration) -> dict[str, Any]:
    """JSON-ready form (what calibrate.py writes, plus meta)."""
    gpus = {n: {**asdict(p), "machine_balance": cal.balance.get(n, 0.0)} for n, p in sorted(cal.gpus.items())}
    return {**cal.meta, "globals": asdict(cal.globals), "gpus": gpus}
