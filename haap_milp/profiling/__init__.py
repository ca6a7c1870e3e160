"""`haap-solve profile`: measure a model's layer kinds on the local device with PyTorch.

torch is imported lazily (extra ``haap-milp[profile]``); this module imports without it.
``layers.py`` builds the modules, ``runner.py`` times one point, this module loops over the grid and
writes the native profile (``estimator/profile_format.py``).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import importlib.util
import json
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from haap_milp.catalog import data as cat
from haap_milp.errors import HaapInputError
from haap_milp.estimator.profile_format import (
    DeviceInfo,
    NativeProfile,
    ProfiledModel,
    ProfileHeader,
    ProfilePoint,
)
from haap_milp.specs import ModelSpec

INSTALL_HINT = "install the profile extra: pip install 'haap-milp[profile]'"
LAYER_KINDS = ("embedding", "decoder", "attention", "mlp", "head")
PRECISIONS = ("fp32", "bf16", "fp16")
LAYERS_NOTE = ("layers: RMSNorm, attention without rotary embedding, MLP with the model's activation "
               "(haap_milp/profiling/layers.py); mixed precision by torch.autocast with fp32 master weights "
               "and fp32 Adam state")


def has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def require_torch() -> Any:
    """The torch module, or a one-paragraph user error naming the extra."""
    if not has_torch():
        raise HaapInputError(f"`haap-solve profile` needs PyTorch, which is not installed; {INSTALL_HINT}",
                             field="torch")
    import torch

    return torch


@dataclass(frozen=True)
class Request:
    model: ModelSpec
    layers: tuple[str, ...]
    micro_batches: tuple[int, ...]
    precisions: tuple[str, ...]
    tps: tuple[int, ...]
    seq_len: int
    device: str  # "cuda" | "cpu"
    gpu_type: str
    warmup: int
    repeats: int
    allow_cpu_tp: bool = False  # tp > 1 on CPU with gloo: tests the distributed code; timings mean nothing

    def grid(self) -> list[tuple[str, int, int, str]]:
        """(precision, tp, micro_batch, layer) in measurement order; small micro-batches first."""
        return [(p, t, b, k) for p in self.precisions for t in self.tps for b in self.micro_batches
                for k in self.layers]


def gpu_type_from_name(device_name: str) -> str | None:
    """Catalog GPU name for a driver-reported name ('NVIDIA H100 80GB HBM3' -> 'h100-80g'), or None."""
    words = [w for w in re.split(r"[\s_]+", device_name.lower()) if w not in ("nvidia", "tesla", "amd", "instinct")]
    words = [w for w in words if not w.startswith("hbm")]
    candidates = ["-".join(words)]
    if words:
        family = words[0].split("-")[0]
        mem = next((m.group(1) for w in words for m in [re.search(r"(\d+)\s*gb", w)] if m), None)
        if mem:
            candidates += [f"{family}-{mem}gb", f"{family}-{mem}g"]
        candidates += ["-".join(words[:2]), family]
    for c in candidates:
        found = cat.canonical("GPU", c)
        if found:
            return found
    return None


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_name() -> str:
    return f"CPU: {cpu_name()}"


def device_info(torch: Any, device: str, gpu_type: str, count: int) -> DeviceInfo:
    driver = None
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        get = getattr(torch._C, "_cuda_getDriverVersion", None)  # CUDA driver API version, e.g. 12040
        if get is not None:
            try:
                v = int(get())
                driver = f"CUDA driver API {v // 1000}.{v % 1000 // 10}"
            except (RuntimeError, ValueError, TypeError):
                driver = None
    else:
        name = _cpu_name()
    cudnn = torch.backends.cudnn.version() if device == "cuda" and torch.backends.cudnn.is_available() else None
    return DeviceInfo(name=name, kind=device if device in ("cuda", "cpu") else "other", count=count,
                      gpu_type=gpu_type, driver_version=driver, cuda_version=torch.version.cuda,
                      cudnn_version=None if cudnn is None else str(cudnn), torch_version=torch.__version__,
                      python_version=platform.python_version(), platform=platform.platform())


def check_request(torch: Any, model: ModelSpec, device: str, tps: tuple[int, ...], allow_cpu_tp: bool = False) -> int:
    """Refuse what cannot be measured here; returns the number of devices used."""
    if model.is_mla:
        raise HaapInputError(f"model {model.name!r} uses multi-head latent attention; `haap-solve profile` measures "
                             "standard (GQA) attention layers only, so its numbers would be another model's. Use the "
                             "analytic estimator for it.", field="model", value=model.name)
    if model.is_moe:
        raise HaapInputError(f"model {model.name!r} is a Mixture of Experts; `haap-solve profile` measures dense "
                             "decoder layers only.", field="model", value=model.name)
    if device == "cuda" and not torch.cuda.is_available():
        raise HaapInputError("--device cuda: PyTorch sees no CUDA device here; use --device cpu.", field="device",
                             value=device)
    have = torch.cuda.device_count() if device == "cuda" else 1
    for t in tps:
        if t < 1 or model.num_heads % t:
            raise HaapInputError(f"--tp {t} must be >= 1 and divide the {model.num_heads} attention heads of "
                                 f"{model.name}.", field="tp", value=t)
        if t > 1 and (device == "cpu" and not allow_cpu_tp or device == "cuda" and have < t):
            raise HaapInputError(f"--tp {t}: measuring tensor parallelism needs {t} GPUs in one torch.distributed "
                                 f"group (one process per GPU); this {device} run has {have} device(s) - measure "
                                 "tp 1 here or run on a machine with more GPUs.", field="tp", value=t)
    return max(tps)


def run(req: Request, on_point: Callable[[ProfilePoint, int, int], None] | None = None) -> NativeProfile:
    """Measure the grid of ``req``; ``on_point(point, done, total)`` after each point (progress). tp 1 runs in
    this process, each tp > 1 in ``tp`` spawned processes (distributed.py; progress per tp degree)."""
    torch = require_torch()
    count = check_request(torch, req.model, req.device, req.tps, req.allow_cpu_tp)
    from haap_milp.profiling.runner import measure

    dev = torch.device(req.device)
    points: list[ProfilePoint] = []
    total = len(req.grid())

    def add(prec: str, tp: int, mbs: int, kind: str, fields: dict[str, Any]) -> None:
        points.append(ProfilePoint(layer_kind=kind, gpu_type=req.gpu_type, tp=tp, micro_batch=mbs,
                                   seq_len=req.seq_len, precision=prec, **fields))
        if on_point is not None:
            on_point(points[-1], len(points), total)

    for tp in req.tps:
        items = [(p, b, k) for p, t, b, k in req.grid() if t == tp]
        if tp == 1:
            for prec, mbs, kind in items:
                add(prec, tp, mbs, kind, measure(kind, req.model, tp, mbs, req.seq_len, prec, dev, req.warmup,
                                                 req.repeats))
        else:
            from haap_milp.profiling.distributed import measure_tp

            for (prec, mbs, kind), fields in zip(items, measure_tp(req.model, tp, items, req.seq_len, req.device,
                                                                   req.warmup, req.repeats), strict=True):
                add(prec, tp, mbs, kind, fields)
    m = req.model
    header = ProfileHeader(
        model=ProfiledModel(name=m.name, num_layers=m.num_layers, hidden=m.hidden, ffn_hidden=m.ffn_hidden,
                            num_heads=m.num_heads, num_kv_heads=m.kv_heads, vocab_size=m.vocab_size,
                            activation=m.activation),
        device=device_info(torch, req.device, req.gpu_type, count),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        tool=f"haap-milp {_version()}",
        memory_method="cuda_max_memory_allocated" if req.device == "cuda" else "cpu_tensor_bytes",
        timing_method=("time.perf_counter around forward, backward and Adam step"
                       + (", torch.cuda.synchronize before each reading" if req.device == "cuda" else "")
                       + f"; median of {req.repeats} after {req.warmup} warm-up"
                       + ("; tp > 1: rank 0 of a torch.distributed group" if count > 1 else "")),
        warmup=req.warmup, repeats=req.repeats,
        notes=[LAYERS_NOTE])
    return NativeProfile(header=header, points=points)


def _version() -> str:
    try:
        return importlib.metadata.version("haap-milp")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def write_atomic(profile: NativeProfile, path: str | Path) -> None:
    """JSON to ``path``, whole or not at all (``outputs.write_atomic``: a device such as /dev/full is written, not
    replaced)."""
    from haap_milp.outputs import write_atomic as write

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write(p, json.dumps(profile.model_dump(mode="json"), indent=1) + "\n", flag="-o")
