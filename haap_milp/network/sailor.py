"""Import Sailor's fitted bandwidth curves (github.com/eth-easl/sailor, ``sailor/providers/``).

Two layouts, told apart by their nesting:

* between VMs (``multizone_bandwidths_het.json``): ``[zone][gpu][n][zone'][gpu'][n'] = [[a, b, c], max_Bps]``
  for n GPUs of one VM of type gpu sending to n' GPUs of a VM of type gpu'. Bandwidth GB/s = a·x² + b·x + c,
  x = log2(message MB), capped at max_Bps bytes/s. Only the chosen ``zone`` -> ``zone`` entries with n = n'
  are imported (n senders matched by n receivers: how stage-to-stage traffic and collectives pair GPUs):
  gpu = gpu' -> ``inter_node`` of that type, otherwise ``cross_type`` (sender type first; the table is not
  symmetric). n = 1 is one GPU's stream (``per: gpu_stream``); n > 1 is what the n GPUs of the VM got
  together (``per: node_nic``, ``senders: n``) - e.g. one A100 stream 1.52 GB/s at 8 MB, four A100s of a VM
  5.66 GB/s together (6.04 GB/s cap), not 4 x 1.52.
* inside a node (``intra_node_bandwidths.json``): ``[gpu][n] = [[a, b, c], max_Bps]`` for n GPUs of one node ->
  ``intra_node`` of that type, one GPU's bandwidth in a group of n (``per: gpu_stream``, ``senders: n``).

The fits carry their own start-up costs (they are fitted to measured transfer times), so ``latency_us`` is 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from haap_milp.catalog.files import parse_text, read_text
from haap_milp.catalog.validation import format_validation_error
from haap_milp.errors import HaapInputError
from haap_milp.network import names
from haap_milp.network.spec import Log2QuadraticCurve, MeasuredLink

SOURCE = "Sailor (github.com/eth-easl/sailor)"


def _curve(entry: Any, where: str) -> Log2QuadraticCurve:
    try:
        (a, b, c), max_bps = entry
        return Log2QuadraticCurve(coefficients=(float(a), float(b), float(c)), max_gbps=float(max_bps) / 1e9)
    except ValidationError as exc:  # (a ValueError too: its own words, without pydantic's type tags and links)
        raise format_validation_error(Log2QuadraticCurve, exc, f"{where}: {entry!r} is not a curve haap can use") \
            from None
    except (TypeError, ValueError):
        raise HaapInputError(f"{where} must be [[a, b, c], max_bytes_per_s] (three numbers, then one), got "
                             f"{entry!r}.", field="file") from None


def _count(key: str, where: str) -> int:
    if not key.isdigit() or int(key) < 1:
        raise HaapInputError(f"{where}: {key!r} is not a GPU count.", field="file", value=key)
    return int(key)


def is_intra_node(data: dict) -> bool:
    """``[gpu][n] = [...]`` (inside a node) rather than ``[zone][gpu][n][...]`` (between VMs)."""
    first = next(iter(data.values()), None)
    return isinstance(first, dict) and all(isinstance(v, list) for v in first.values())


def read(path: Path) -> dict:
    # bounded read (size, FIFO, folder, binary), nesting and NaN/inf refused: catalog/files.py
    data = parse_text(read_text(path, "Sailor bandwidth file"), str(path), "json")
    if not isinstance(data, dict) or not data or not all(isinstance(v, dict) for v in data.values()):
        raise HaapInputError(f"Sailor bandwidth file {str(path)!r} must map zones (or GPU names) to tables.",
                             field="file", value=str(path))
    return data


def import_links(path: Path, zone: str | None, gpu_names: dict[str, str]) -> list[MeasuredLink]:
    """Measured links from one Sailor file (``zone`` is required for the between-VMs layout)."""
    data = read(path)
    if is_intra_node(data):
        return _intra(data, path, gpu_names)
    if zone is None:
        raise HaapInputError(f"Sailor bandwidth file {str(path)!r} holds zones ({', '.join(data)}); choose one with "
                             f"--zone, e.g. --zone {next(iter(data))}.", field="zone")
    if zone not in data:
        raise HaapInputError(f"--zone {zone!r} is not in {str(path)!r}; it has {', '.join(data)}.", field="zone",
                             value=zone)
    table = data[zone]
    mapped = names.resolve(list(table) + [g for per_n in table.values() for z in per_n.values()
                                          for g in z.get(zone, {})], gpu_names, f"Sailor file {str(path)!r}")
    links = []
    for gpu, per_n in table.items():
        for n_key, dest in per_n.items():
            n = _count(n_key, f"{path}: [{zone}][{gpu}]")
            for gpu2, per_n2 in dest.get(zone, {}).items():
                src, dst = mapped[gpu], mapped[gpu2]
                if src is None or dst is None or n_key not in per_n2:
                    continue
                entry = per_n2[n_key]
                where = f"{path}: [{zone}][{gpu}][{n}][{zone}][{gpu2}][{n}]"
                cls, types = ("inter_node", (src,)) if src == dst else ("cross_type", (src, dst))
                links.append(MeasuredLink(link=cls, gpu_types=types, per="gpu_stream" if n == 1 else "node_nic",
                                          senders=n, op="p2p", curve=_curve(entry, where),
                                          source=f"{SOURCE}: {path.name} [{zone}][{gpu}][{n}][{zone}][{gpu2}][{n}]"))
    if not links:
        raise HaapInputError(f"{str(path)!r} has no {zone} -> {zone} entries with as many receivers as senders.",
                             field="zone", value=zone)
    return links


def _intra(data: dict, path: Path, gpu_names: dict[str, str]) -> list[MeasuredLink]:
    mapped = names.resolve(list(data), gpu_names, f"Sailor file {str(path)!r}")
    links = []
    for gpu, per_n in data.items():
        if mapped[gpu] is None:
            continue
        for n_key, entry in per_n.items():
            n = _count(n_key, f"{path}: [{gpu}]")
            links.append(MeasuredLink(link="intra_node", gpu_types=(mapped[gpu],), per="gpu_stream", senders=n,
                                      op="p2p", curve=_curve(entry, f"{path}: [{gpu}][{n}]"),
                                      source=f"{SOURCE}: {path.name} [{gpu}][{n}]"))
    return links
