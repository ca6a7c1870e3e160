"""Tensor-parallel points: one process per GPU in one torch.distributed group (imports torch).

``measure_tp`` spawns ``tp`` processes (``torch.multiprocessing.spawn``), rendezvous through a file in a
temporary directory, backend NCCL on CUDA (process r on ``cuda:r``). Every rank builds its shard
(``layers.py``: Megatron-style column/row-parallel linears, all-reduce after the row-parallel ones) and runs
the same points with a barrier before each repeat; rank 0's times and memory are recorded (one GPU of the
group, TP communication included, as the profile format defines).

On CPU the same code runs with the gloo backend when the caller asks for it explicitly (``allow_cpu``): that
checks the distributed machinery in tests; CPU timings of tp > 1 stand for no GPU and the CLI refuses them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from haap_milp.specs import ModelSpec


def _worker(rank: int, tp: int, device: str, rendezvous: str, model_json: str, items: list[list[Any]],
            seq: int, warmup: int, repeats: int, out: str) -> None:
    from haap_milp.profiling.runner import measure

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", world_size=tp, rank=rank)
    try:
        dev = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device("cpu")
        if device == "cpu":
            torch.set_num_threads(1)
        model = ModelSpec.model_validate_json(model_json)
        group = dist.group.WORLD
        results = []
        for prec, mbs, kind in items:
            dist.barrier()
            results.append(measure(kind, model, tp, mbs, seq, prec, dev, warmup, repeats, group=group))
        if rank == 0:
            Path(out).write_text(json.dumps(results), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def measure_tp(model: ModelSpec, tp: int, items: list[tuple[str, int, str]], seq: int, device: str, warmup: int,
               repeats: int) -> list[dict[str, Any]]:
    """Measured fields of each (precision, micro_batch, layer_kind) of ``items`` at tensor-parallel degree ``tp``."""
    with tempfile.TemporaryDirectory(prefix="haap-tp-") as tmp:
        out = str(Path(tmp) / "rank0.json")
        args = (tp, device, str(Path(tmp) / "rendezvous"), model.model_dump_json(), [list(i) for i in items], seq,
                warmup, repeats, out)
        # CUDA is initialised in this process (device checks), so CUDA workers must be spawned; CPU ones fork
        mp.start_processes(_worker, args=args, nprocs=tp, join=True,
                           start_method="spawn" if device == "cuda" else "fork")
        return json.loads(Path(out).read_text(encoding="utf-8"))
