"""Measured per-layer profiles that override the analytic layer times (and memory when given).

Two input formats:

* **Metis** directories (github.com/SamsungLabs/Metis; as published with Sailor, MIT): files
  ``DeviceType.<TYPE>_tp<T>_bs<B>.json`` with ``execution_time.layer_compute_total_ms[i]`` (ms of
  forward + backward of one micro-batch through layer i; index 0 = embedding, last = LM head),
  ``execution_memory.layer_memory_total_mb[i]`` (MiB per GPU) and
  ``model.parameters.parameters_per_layer_bytes[i]``. ``<TYPE>`` is mapped to a catalog GPU name by
  ``device_map`` (defaults in ``DEFAULT_DEVICE_MAP``; e.g. ``{"A100": "a100-80g"}`` overrides).
* **Native** YAML/JSON (one file)::

      haap_profile: 1
      source: "where and how it was measured"
      seq_len: 2048                    # optional; must equal the training sequence length
      entries:
        - {gpu: a100-40g, tp: 1, mbs: 1, layer_time_ms: 8.22,
           embedding_time_ms: 0.40, head_time_ms: 8.50,                  # optional
           layer_memory_mib: 584.3, embedding_memory_mib: 1030.5, head_memory_mib: 1778.6}  # optional

  ``mbs`` is the per-replica micro-batch, times are forward + backward of one micro-batch of one
  (mean) decoder layer on one GPU of a tp group, TP communication included; memory is per GPU,
  parameters + gradients + optimizer state + activations of one micro-batch.

A profile covers (gpu, tp, mbs) points. What happens at a point it does not cover is
``Profile.fallback`` (``override.coverage``, the one home of that rule): ``none`` (default) leaves such
points out, ``interpolate`` also prices points between two measured mbs of the same (gpu, tp) by linear
interpolation (``Profile.lookup``), ``analytic`` prices every other point with the analytic model too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from haap_milp.errors import HaapInputError

MIB = 2**20
DEFAULT_DEVICE_MAP = {
    "A100": "a100-40g", "V100": "v100-16g", "H100": "h100-80g", "H200": "h200-141g", "A10": "a10-24g",
    "L4": "l4-24g", "L40S": "l40s-48g", "T4": "t4-16g",
}
METIS_NAME = re.compile(r"^DeviceType\.(?P<dev>[A-Za-z0-9]+)_tp(?P<tp>\d+)_bs(?P<bs>\d+)\.json$")


@dataclass(frozen=True)
class ProfileEntry:
    """One measured point (gpu, tp, mbs). Times in s, memory in bytes per GPU (None: not measured)."""

    gpu: str
    tp: int
    mbs: int
    layer_time_s: float
    embedding_time_s: float | None = None
    head_time_s: float | None = None
    layer_memory_bytes: float | None = None
    embedding_memory_bytes: float | None = None
    head_memory_bytes: float | None = None


@dataclass(frozen=True)
class Profile:
    """Measured points keyed by (gpu, tp, mbs)."""

    entries: dict[tuple[str, int, int], ProfileEntry]
    source: str = ""
    seq_len: int | None = None
    num_layers: int | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    fallback: str = "none"  # none | interpolate | analytic: points the profile lacks (override.coverage)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.entries)), self.source, self.seq_len, self.fallback))

    def oom_points(self) -> frozenset[tuple[str, int, int]]:
        """(gpu, tp, mbs) points measured out of memory (native profiles; Metis directories have none)."""
        return frozenset(k[:3] for k in self.meta.get("oom_keys", ()))

    def gpu_types(self) -> frozenset[str]:
        """GPU types the profile measured (a point or an out-of-memory point)."""
        return frozenset(g for g, _, _ in self.entries) | frozenset(g for g, _, _ in self.oom_points())

    def points(self, gpu: str, tp: int) -> list[ProfileEntry]:
        return sorted((e for (g, t, _), e in self.entries.items() if g == gpu and t == tp), key=lambda e: e.mbs)

    def lookup(self, gpu: str, tp: int, mbs: float) -> ProfileEntry | None:
        """The measured point, or a linear interpolation between the two nearest mbs (None outside)."""
        exact = self.entries.get((gpu, tp, int(mbs))) if float(mbs).is_integer() else None
        if exact is not None:
            return exact
        pts = self.points(gpu, tp)
        lo = [e for e in pts if e.mbs < mbs]
        hi = [e for e in pts if e.mbs > mbs]
        if not lo or not hi:
            return None
        a, b = lo[-1], hi[0]
        w = (mbs - a.mbs) / (b.mbs - a.mbs)
        mix = lambda x, y: None if x is None or y is None else x + w * (y - x)
        return ProfileEntry(gpu, tp, int(mbs), mix(a.layer_time_s, b.layer_time_s),
                            mix(a.embedding_time_s, b.embedding_time_s), mix(a.head_time_s, b.head_time_s),
                            mix(a.layer_memory_bytes, b.layer_memory_bytes),
                            mix(a.embedding_memory_bytes, b.embedding_memory_bytes),
                            mix(a.head_memory_bytes, b.head_memory_bytes))

    def memory_split(self, gpu: str, tp: int, kind: str = "layer") -> tuple[float, float] | None:
        """(static bytes, activation bytes per sample) by least squares of memory = static + mbs·act over
        the measured mbs of (gpu, tp); None with fewer than two memory points."""
        pts = [(e.mbs, getattr(e, f"{kind}_memory_bytes")) for e in self.points(gpu, tp)]
        pts = [(x, y) for x, y in pts if y is not None]
        if len({x for x, _ in pts}) < 2:
            return None
        n = len(pts)
        mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
        slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        return max(0.0, my - slope * mx), max(0.0, slope)


def _metis_entry(path: Path, gpu: str, tp: int, bs: int) -> tuple[ProfileEntry, int]:
    from haap_milp.catalog.files import load_data

    data = load_data(path, "Metis profile")
    try:
        times = [float(x) for x in data["execution_time"]["layer_compute_total_ms"]]
        mem = data.get("execution_memory", {}).get("layer_memory_total_mb")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HaapInputError(f"Metis profile {path.name} is unreadable or lacks execution_time."
                             f"layer_compute_total_ms: {exc}", field="profile", value=str(path)) from exc
    if len(times) < 3 or any(not 0 < t < 1e9 for t in times):
        raise HaapInputError(f"Metis profile {path.name}: layer_compute_total_ms needs embedding, >= 1 layer and "
                             f"head, all positive (got {len(times)} values).", field="profile", value=str(path))
    mem_b = [float(x) * MIB for x in mem] if mem and len(mem) == len(times) else None
    layer_mem = sum(mem_b[1:-1]) / (len(times) - 2) if mem_b else None
    entry = ProfileEntry(gpu, tp, bs, sum(times[1:-1]) / (len(times) - 2) / 1e3, times[0] / 1e3, times[-1] / 1e3,
                         layer_mem, mem_b[0] if mem_b else None, mem_b[-1] if mem_b else None)
    return entry, len(times) - 2


def load_metis_dir(path: str | Path, device_map: dict[str, str] | None = None) -> Profile:
    """All ``DeviceType.<TYPE>_tp<T>_bs<B>.json`` files of ``path`` (or ``path/profile``)."""
    from haap_milp.catalog.files import is_dir

    root = Path(path)
    if is_dir(root / "profile"):
        root = root / "profile"
    files = sorted(p for p in root.glob("DeviceType.*.json") if METIS_NAME.match(p.name)) if is_dir(root) else []
    if not files:
        raise HaapInputError(f"no Metis profile files (DeviceType.<TYPE>_tp<T>_bs<B>.json) in {str(path)!r}.",
                             field="profile", value=str(path))
    names = {**DEFAULT_DEVICE_MAP, **(device_map or {})}
    entries: dict[tuple[str, int, int], ProfileEntry] = {}
    layers: set[int] = set()
    for f in files:
        m = METIS_NAME.match(f.name)
        dev = m["dev"]
        if dev not in names:
            raise HaapInputError(f"Metis device type {dev!r} ({f.name}) has no catalog GPU name; map it, e.g. "
                                 f"--profile-device {dev}=a100-80g.", field="profile.device_map", value=dev)
        entry, n = _metis_entry(f, names[dev], int(m["tp"]), int(m["bs"]))
        entries[(entry.gpu, entry.tp, entry.mbs)] = entry
        layers.add(n)
    if len(layers) != 1:
        raise HaapInputError(f"Metis profiles in {str(path)!r} disagree on the number of layers: {sorted(layers)}.",
                             field="profile", value=str(path))
    return Profile(entries, source=f"Metis profile directory {root}", num_layers=layers.pop(),
                   meta={"devices": sorted({METIS_NAME.match(f.name)["dev"] for f in files})})


def _whole(raw: dict, key: str, i: int) -> int:
    """``raw[key]`` as a whole number: tp 1.9 is a mistake, not tp 1 (int() truncated it)."""
    v = raw[key]
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, (bool, float)) or (isinstance(v, str) and not v.strip().isdigit()):
        raise HaapInputError(f"profile entries[{i}].{key} = {v!r:.40} must be a whole number.",
                             field=f"entries[{i}].{key}", value=v)
    return int(v)


def _native_entry(raw: Any, i: int) -> ProfileEntry:
    if not isinstance(raw, dict):
        raise HaapInputError(f"profile entries[{i}] must be a mapping, got {type(raw).__name__}.",
                             field=f"entries[{i}]")
    try:
        opt = lambda k, scale: None if raw.get(k) is None else float(raw[k]) * scale
        e = ProfileEntry(str(raw["gpu"]), _whole(raw, "tp", i), _whole(raw, "mbs", i), float(raw["layer_time_ms"]) / 1e3,
                         opt("embedding_time_ms", 1e-3), opt("head_time_ms", 1e-3), opt("layer_memory_mib", MIB),
                         opt("embedding_memory_mib", MIB), opt("head_memory_mib", MIB))
    except HaapInputError:
        raise
    except KeyError as exc:
        raise HaapInputError(f"profile entries[{i}] lacks {exc.args[0]!r} (needs gpu, tp, mbs, layer_time_ms).",
                             field=f"entries[{i}].{exc.args[0]}") from exc
    except (TypeError, ValueError, OverflowError) as exc:
        raise HaapInputError(f"profile entries[{i}] has a non-numeric value: {exc}.", field=f"entries[{i}]") from exc
    import math

    values = [v for v in (e.layer_time_s, e.embedding_time_s, e.head_time_s, e.layer_memory_bytes,
                          e.embedding_memory_bytes, e.head_memory_bytes) if v is not None]
    if e.tp < 1 or e.mbs < 1 or e.tp > 4096 or e.mbs > 2**20 or e.layer_time_s <= 0 or \
            any(not math.isfinite(v) or v < 0 for v in values):
        raise HaapInputError(f"profile entries[{i}]: tp and mbs must be >= 1 (and sensible), layer_time_ms > 0 and "
                             "every time and memory a finite number >= 0.",
                             field=f"entries[{i}]")
    return e


def load_native(path: str | Path) -> Profile:
    """A native profile file of the YAML form (``haap_profile: 1``; YAML or JSON, module doc)."""
    from haap_milp.catalog.files import load_data

    return native_from_data(load_data(Path(path), "profile"), path)


def native_from_data(data: object, path: str | Path) -> Profile:
    """The YAML-form profile from its parsed ``data`` (read by the shared safe loader)."""
    if not isinstance(data, dict) or "entries" not in data or not isinstance(data["entries"], list):
        raise HaapInputError(f"profile {str(path)!r} needs a top-level 'entries' list (native haap profile format).",
                             field="profile", value=str(path))
    entries, first = {}, {}
    for i, raw in enumerate(data["entries"]):
        e = _native_entry(raw, i)
        key = (e.gpu, e.tp, e.mbs)
        if key in entries:  # (the later one would win silently)
            raise HaapInputError(f"profile {str(path)!r}: entries[{i}] and entries[{first[key]}] both measure gpu "
                                 f"{e.gpu}, tp {e.tp}, mbs {e.mbs}; keep one.", field=f"entries[{i}]", value=str(path))
        entries[key], first[key] = e, i
    seq = data.get("seq_len")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= 2**24):
        raise HaapInputError(f"profile {str(path)!r}: seq_len = {seq!r:.40} must be a whole number of tokens "
                             "(1 to 16777216).", field="seq_len", value=seq)
    return Profile(entries, source=str(data.get("source", Path(path).name)), seq_len=int(seq) if seq else None)


def to_native(profile: Profile) -> dict[str, Any]:
    """The native form of any profile (e.g. to convert a Metis directory once)."""
    rows = []
    for e in sorted(profile.entries.values(), key=lambda e: (e.gpu, e.tp, e.mbs)):
        row: dict[str, Any] = {"gpu": e.gpu, "tp": e.tp, "mbs": e.mbs, "layer_time_ms": e.layer_time_s * 1e3}
        for k, v, s in (("embedding_time_ms", e.embedding_time_s, 1e3), ("head_time_ms", e.head_time_s, 1e3),
                        ("layer_memory_mib", e.layer_memory_bytes, 1 / MIB),
                        ("embedding_memory_mib", e.embedding_memory_bytes, 1 / MIB),
                        ("head_memory_mib", e.head_memory_bytes, 1 / MIB)):
            if v is not None:
                row[k] = v * s
        rows.append(row)
    out: dict[str, Any] = {"haap_profile": 1, "source": profile.source, "entries": rows}
    if profile.seq_len:
        out["seq_len"] = profile.seq_len
    return out
