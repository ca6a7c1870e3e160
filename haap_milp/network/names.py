"""GPU names in measurement files -> haap catalog names (``--gpu-name NAME=CATALOG``, or ``NAME=none`` to skip).

Defaults: the name itself if the catalog knows it; Sailor's ``A100-40`` style (type-GiB) with a ``g``
appended (``a100-40g``); a CUDA device name as nccl-tests prints it (``NVIDIA A100-SXM4-40GB``,
``Tesla V100-SXM2-16GB``, ``NVIDIA H100 80GB HBM3``): the chip and its memory (``a100-40g``; PCIe cards
``a100-pcie-80g`` where the catalog has that entry). Anything else is an error that names the flag.
"""

from __future__ import annotations

import re

from haap_milp.catalog.data import canonical, gpu_names
from haap_milp.errors import HaapInputError

SKIP = "none"
_CHIP = re.compile(r"\b(GH200|H200|H100|H800|H20|A100|A800|A10|V100|L40S|L4|T4|MI250X|MI300X)\b", re.IGNORECASE)
_MEM = re.compile(r"(\d+)\s*G[Bi]?B?\b", re.IGNORECASE)


def parse_mapping(items: list[str], flag: str = "--gpu-name") -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item or not item.split("=", 1)[0].strip() or not item.split("=", 1)[1].strip():
            raise HaapInputError(f"{flag} {item!r} must look like A100-40=a100-40g (or NAME=none to leave it out).",
                                 field=flag.lstrip("-"), value=item)
        k, v = (x.strip() for x in item.split("=", 1))
        if v.lower() != SKIP:
            found = canonical("GPU", v)
            if found is None:
                raise HaapInputError(f"{flag} {item!r}: {v!r} is not a GPU of the catalog (see haap-solve catalog).",
                                     field=flag.lstrip("-"), value=item)
            v = found
        out[k] = v.lower() if v.lower() == SKIP else v
    return out


def default_name(name: str) -> str | None:
    """The catalog name a measurement file's GPU name stands for, or None."""
    for guess in (name, name + "g"):
        found = canonical("GPU", guess)
        if found is not None:
            return found
    chip = _CHIP.search(name)
    if chip is None:
        return None
    mem = _MEM.search(name[:chip.start()] + name[chip.end():])
    pcie = "-pcie" if "pcie" in name.lower() else ""
    kind = chip.group(1).lower()
    if mem is not None:
        for guess in (f"{kind}{pcie}-{mem.group(1)}g", f"{kind}-{mem.group(1)}g"):
            found = canonical("GPU", guess)
            if found is not None:
                return found
        return None
    same = [g for g in gpu_names() if g.startswith(f"{kind}{pcie}-") and (pcie or "-pcie-" not in g)]
    return same[0] if len(same) == 1 else None  # no memory in the name: only when the chip has one entry


def resolve(names: list[str], mapping: dict[str, str], source: str) -> dict[str, str | None]:
    """name -> catalog name (None: left out with NAME=none); one error paragraph listing every unknown name."""
    out: dict[str, str | None] = {}
    unknown = []
    for n in dict.fromkeys(names):
        if n in mapping:
            out[n] = None if mapping[n] == SKIP else mapping[n]
        elif (found := default_name(n)) is not None:
            out[n] = found
        else:
            unknown.append(n)
    if unknown:
        ex = unknown[0]
        raise HaapInputError(f"{source}: GPU name(s) {', '.join(repr(u) for u in unknown)} are not in haap's catalog; "
                             f"map each with --gpu-name, e.g. --gpu-name '{ex}=a100-80g', or leave it out with "
                             f"--gpu-name '{ex}=none' (catalog names: haap-solve catalog).", field="gpu_name", value=ex)
    return out
