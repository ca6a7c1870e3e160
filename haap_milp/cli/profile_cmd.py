"""`haap-solve profile`: measure the model's layer kinds on this machine (parsing and printing only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from haap_milp.catalog import data as cat
from haap_milp.catalog import load_model
from haap_milp.cli.common import console
from haap_milp.cli.typer_app import app
from haap_milp.errors import HaapInputError

Opt = typer.Option


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        vals = ()
    if not vals or any(v < 1 for v in vals):
        raise HaapInputError(f"{flag} {text!r} must be a comma-separated list of positive integers, e.g. 1,2,4.",
                             field=flag.lstrip("-"), value=text)
    return tuple(dict.fromkeys(vals))


def _names(text: str, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    vals = tuple(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip()))
    bad = [v for v in vals if v not in allowed]
    if not vals or bad:
        raise HaapInputError(f"{flag} {text!r}: use a comma-separated list of {', '.join(allowed)}.",
                             field=flag.lstrip("-"), value=text)
    return vals


@app.command("profile")
def profile_cmd(
    model: Annotated[str, Opt("--model", "-m", help="Catalog name, HF config.json or YAML.")],
    out: Annotated[Path, Opt("--out", "-o", help="Native profile JSON to write.")] = Path("profile.json"),
    micro_batches: Annotated[str, Opt("--micro-batches", help="Micro-batch sizes, e.g. 1,2,4,8.")] = "1,2,4,8",
    precisions: Annotated[str, Opt("--precisions", help="bf16, fp16, fp32 (comma-separated).")] = "bf16",
    seq: Annotated[int | None, Opt("--seq", help="Sequence length (default: the model's).")] = None,
    tp: Annotated[str, Opt("--tp", help="Tensor-parallel degrees; > 1 needs that many GPUs.")] = "1",
    device: Annotated[str | None, Opt("--device", help="cuda | cpu (default: cuda if available).")] = None,
    gpu_type: Annotated[str | None, Opt("--gpu-type", help="Catalog GPU to record (default: from the device "
                                                          "name; required on CPU).")] = None,
    warmup: Annotated[int, Opt("--warmup", help="Untimed runs per point.")] = 3,
    repeats: Annotated[int, Opt("--repeats", help="Timed runs per point (median and spread).")] = 10,
    layers: Annotated[str, Opt("--layers", help="embedding, decoder, attention, mlp, head.")] = "embedding,decoder,head",
) -> None:
    """Measure forward, backward, Adam step and peak memory of the model's layers with PyTorch; write a native
    profile for `estimate --profile`."""
    from haap_milp import profiling as prof

    m = load_model(model)
    mbs, tps = _ints(micro_batches, "--micro-batches"), _ints(tp, "--tp")
    precs = _names(precisions, "--precisions", prof.PRECISIONS)
    kinds = _names(layers, "--layers", prof.LAYER_KINDS)
    if warmup < 0 or repeats < 1:
        raise HaapInputError(f"--warmup {warmup} must be >= 0 and --repeats {repeats} >= 1.", field="repeats",
                             value=repeats)
    if seq is not None and seq < 1:
        raise HaapInputError(f"--seq {seq} must be at least 1.", field="seq", value=seq)
    torch = prof.require_torch()
    dev = (device or ("cuda" if torch.cuda.is_available() else "cpu")).strip().lower()
    if dev not in ("cuda", "cpu"):
        raise HaapInputError(f"--device {device!r} must be cuda or cpu.", field="device", value=device)
    if gpu_type is not None:
        name = cat.canonical("GPU", gpu_type)
        if name is None:
            raise HaapInputError(f"--gpu-type {gpu_type!r} is not a catalog GPU (`haap-solve catalog gpus`).",
                                 field="gpu_type", value=gpu_type)
    elif dev == "cuda" and torch.cuda.is_available():
        reported = torch.cuda.get_device_name(0)
        name = prof.gpu_type_from_name(reported)
        if name is None:
            raise HaapInputError(f"device {reported!r} matches no catalog GPU; name the one to record with "
                                 "--gpu-type (`haap-solve catalog gpus`).", field="gpu_type", value=reported)
    else:
        raise HaapInputError("--gpu-type is required with --device cpu: name the catalog GPU the measurements "
                             "stand for (e.g. --gpu-type a100-80g).", field="gpu_type")
    req = prof.Request(model=m, layers=kinds, micro_batches=mbs, precisions=precs, tps=tps, seq_len=seq or m.seq_len,
                       device=dev, gpu_type=name, warmup=warmup, repeats=repeats)
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"))
    with Progress(*cols, console=console, transient=False) as bar:
        job = bar.add_task(f"profile {m.name} on {dev}", total=len(req.grid()), note="")

        def progress(pt, done: int, total: int) -> None:
            what = "OOM" if pt.out_of_memory else f"fwd {pt.forward_s * 1e3:.2f} ms bwd {pt.backward_s * 1e3:.2f} ms"
            bar.update(job, completed=done, note=f"{pt.layer_kind} {pt.precision} tp{pt.tp} mbs{pt.micro_batch}: "
                                                  f"{what}")

        result = prof.run(req, progress)
    prof.write_atomic(result, out)
    ooms = sum(p.out_of_memory for p in result.points)
    console.print(f"wrote {out}: {len(result.points)} points ({ooms} out of memory) on {result.header.device.name} "
                  f"recorded as {name}", highlight=False, markup=False)
