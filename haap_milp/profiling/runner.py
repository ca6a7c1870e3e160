"""Timing and memory of one layer kind at one (tp, micro-batch, precision) point (imports torch).

Per repeat: gradients cleared (untimed), then forward, backward and one Adam step, each bracketed by
``torch.cuda.synchronize()`` on CUDA (nothing to wait for on CPU) and timed with ``time.perf_counter``.
The first ``warmup`` repeats are discarded; the point records the median and the spread (min, max,
inter-quartile range) of the rest.

Precision: fp32 master weights and fp32 Adam state, compute under ``torch.autocast`` at bf16/fp16
(fp32: no autocast) - Megatron's mixed precision without the distributed optimizer.

Memory (``peak_memory_bytes``):

* CUDA: ``torch.cuda.max_memory_allocated`` over the timed repeats (peak statistics reset after the
  warm-up, when parameters, gradients and Adam state already exist) - the caching allocator's
  fragmentation is not included.
* CPU: no allocator statistics exist, so the bytes of the tensors involved are counted in one extra,
  untimed pass: parameters + gradients + Adam state + the distinct storages saved for backward
  (``torch.autograd.graph.saved_tensors_hooks``) + the input and output. Temporaries freed inside an
  operator are not seen, so this is a lower bound of the real peak (``memory_method: cpu_tensor_bytes``).

Out of memory (``torch.cuda.OutOfMemoryError`` or an allocator "out of memory" / "can't allocate"
RuntimeError) is caught; the point is recorded with ``out_of_memory: true``.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from typing import Any

import torch

from haap_milp.profiling.layers import build, make_inputs
from haap_milp.specs import ModelSpec

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _spread(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"min_s": min(xs), "max_s": max(xs), "iqr_s": max(0.0, q[2] - q[0])}


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _cpu_tensor_bytes(mod, opt, args, grad, device, precision) -> int:
    """Params + grads + Adam state + distinct saved-for-backward storages + input + output (module doc)."""
    params = list(mod.parameters())
    own = {p.untyped_storage().data_ptr() for p in params}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in own:
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast(device, precision):
        out = mod(*args)
    (out.backward() if grad is None else out.backward(grad))
    state = [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)]
    return (_nbytes(params) + _nbytes(p.grad for p in params) + _nbytes(state) + sum(saved.values())
            + _nbytes(a for a in args) + out.numel() * out.element_size())


def measure(kind: str, model: ModelSpec, tp: int, micro_batch: int, seq: int, precision: str,
            device: torch.device, warmup: int, repeats: int, group=None) -> dict[str, Any]:
    """One point's measured fields (ProfilePoint without gpu_type); OOM -> ``out_of_memory: True``."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    mod = opt = args = grad = None
    try:
        gen = torch.Generator().manual_seed(0)
        mod = build(kind, model, tp, device, group)
        opt = torch.optim.Adam(mod.parameters(), lr=1e-4)
        args, grad = make_inputs(kind, model, tp, micro_batch, seq, device, gen)
        times: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
        for i in range(warmup + repeats):
            opt.zero_grad(set_to_none=True)
            for a in args:
                a.grad = None
            if cuda and i == warmup:
                torch.cuda.reset_peak_memory_stats(device)
            if group is not None:
                torch.distributed.barrier(group)  # tp ranks start each repeat together
            sync()
            t0 = time.perf_counter()
            with _autocast(device, precision):
                out = mod(*args)
            sync()
            t1 = time.perf_counter()
            out.backward() if grad is None else out.backward(grad)
            sync()
            t2 = time.perf_counter()
            opt.step()
            sync()
            t3 = time.perf_counter()
            del out
            if i >= warmup:
                times["forward"].append(t1 - t0)
                times["backward"].append(t2 - t1)
                times["optimizer"].append(t3 - t2)
        if cuda:
            peak = int(torch.cuda.max_memory_allocated(device))
        else:
            opt.zero_grad(set_to_none=True)
            peak = _cpu_tensor_bytes(mod, opt, args, grad, device, precision)
        return {"forward_s": statistics.median(times["forward"]), "backward_s": statistics.median(times["backward"]),
                "optimizer_s": statistics.median(times["optimizer"]), "peak_memory_bytes": peak,
                "out_of_memory": False, "repeats": repeats, "spread": {k: _spread(v) for k, v in times.items()}}
    except (RuntimeError, MemoryError) as exc:
        if not (isinstance(exc, MemoryError) or _is_oom(exc)):
            raise
        return {"out_of_memory": True, "repeats": 0, "note": " ".join(str(exc).split())[:300]}
    finally:
        del mod, opt, args, grad
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
