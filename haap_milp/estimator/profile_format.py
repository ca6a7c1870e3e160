"""The native measured-profile format (JSON, ``haap-solve schema profile``) and its loader.

A native profile is what ``haap-solve profile`` writes (and what any other tool may write): a header
(model shapes, device, versions, how it was measured) and a list of points. One point is one layer
kind (embedding | decoder | attention | mlp | head) measured on one GPU type at one tensor-parallel
degree, micro-batch, sequence length and precision:

* ``forward_s`` / ``backward_s`` / ``optimizer_s``: median seconds over ``repeats`` timed runs (after
  warm-up) of the forward pass, the backward pass and one Adam step over the layer's parameters, on one
  GPU of a tp group (TP communication included); ``spread`` gives min, max and inter-quartile range.
* ``peak_memory_bytes``: per GPU, parameters + gradients + optimizer state + activations of one
  micro-batch (``header.memory_method`` says how it was measured); None when not measured.
* ``out_of_memory: true``: the point did not fit; its times and memory are None.

The loader (``load_native_json``) turns the points of one precision and one sequence length into the
``Profile`` that ``estimator.override`` consumes (the same object a Metis directory gives):

* layer time = forward_s + backward_s of the decoder point (Metis' ``layer_compute_total_ms`` is the
  same sum); without a decoder point, attention + mlp points of the same key are added (stated in the
  notes); embedding and head likewise.
* layer memory = peak_memory_bytes of the decoder point. Two separate attention and mlp peaks do not add
  up to the layer's peak (each includes its own input and temporaries), so they are not combined: the
  analytic memory stands for such keys (stated in the notes).
* ``optimizer_s`` is carried in ``Profile.meta["optimizer_s"]`` but not used yet: the estimator's
  analytic optimizer step stands.
* Out-of-memory points are never priced: they are left out of the entries and listed in
  ``meta["oom_keys"]`` as (gpu_type, tp, micro_batch, precision) so that a later policy can exclude
  those options. ``meta["covered_keys"]`` lists the keys with a measured decoder time.
* Points the profile does not cover: ``Profile.fallback`` (``estimator.override.coverage``) decides:
  by default they leave the search; ``interpolate`` prices those between two measured micro-batches of
  the same (gpu_type, tp) linearly, ``analytic`` the others with the analytic model.

``load_profiles`` reads several profiles (e.g. one per GPU type) into one ``Profile``: the same
(gpu_type, tp, micro_batch) point in two files with different values is an error naming both.

The older one-file YAML form (``haap_profile: 1`` with ``entries``) is still read by ``profiles.py``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from haap_milp.catalog.files import is_dir, load_data
from haap_milp.errors import HaapInputError
from haap_milp.estimator.profiles import Profile, ProfileEntry, load_metis_dir, native_from_data

FORMAT_NAME = "haap-profile"
FORMAT_VERSION = 2  # version 1 is the YAML 'haap_profile: 1' / 'entries' form of profiles.py
LayerKind = Literal["embedding", "decoder", "attention", "mlp", "head"]
ProfilePrecision = Literal["fp32", "bf16", "fp16", "fp8"]
MemoryMethod = Literal["cuda_max_memory_allocated", "cpu_tensor_bytes", "external", "none"]
Key = tuple[str, int, int, str]  # (gpu_type, tp, micro_batch, precision)
UNCOVERED_POLICY = ("points not in the profile: Profile.fallback decides (estimator.override.coverage; default none: "
                    "left out of the search)")


# Bounds on one measured point: a layer's forward or backward on one micro-batch takes milliseconds to seconds, and
# one GPU holds at most a few hundred GiB; values beyond these are corrupt files, and an absurd time would overflow
# the iteration time (and its $ and J figures) to infinity.
MAX_POINT_S = 3600.0
MAX_POINT_BYTES = 2**50  # 1 PiB


class _Strict(BaseModel):
    # (defer_build: built on first use, as specs/base.py's Frozen)
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Spread(_Strict):
    """Spread of one timed phase over the repeats (seconds)."""

    min_s: float = Field(ge=0, le=MAX_POINT_S)
    max_s: float = Field(ge=0, le=MAX_POINT_S)
    iqr_s: float = Field(ge=0, le=MAX_POINT_S, description="Inter-quartile range (q3 - q1) of the repeats.")


class ProfilePoint(_Strict):
    """One measured (layer kind, gpu type, tp, micro-batch, seq_len, precision) point."""

    layer_kind: LayerKind = Field(description="embedding | decoder (one whole layer) | attention | mlp | head "
                                              "(final norm + LM head + loss).")
    gpu_type: str = Field(min_length=1, description="Catalog GPU name the measurement stands for.")
    tp: int = Field(ge=1, description="Tensor-parallel degree (the point is one GPU of the group).")
    micro_batch: int = Field(ge=1, description="Micro-batch size (sequences) per replica.")
    seq_len: int = Field(ge=1, description="Sequence length (tokens).")
    precision: ProfilePrecision
    forward_s: float | None = Field(default=None, gt=0, le=MAX_POINT_S, description="Median forward seconds.")
    backward_s: float | None = Field(default=None, gt=0, le=MAX_POINT_S, description="Median backward seconds.")
    optimizer_s: float | None = Field(default=None, gt=0, le=MAX_POINT_S, description="Median Adam-step seconds (layer params).")
    peak_memory_bytes: int | None = Field(default=None, ge=0, le=MAX_POINT_BYTES, description="Per-GPU peak: params + grads + optimizer "
                                          "state + activations of one micro-batch.")
    out_of_memory: bool = Field(default=False, description="The point did not fit; times and memory are None.")
    repeats: int = Field(default=0, ge=0, description="Timed repeats behind the medians.")
    spread: dict[Literal["forward", "backward", "optimizer"], Spread] = Field(default_factory=dict)
    note: str | None = Field(default=None, description="E.g. the out-of-memory message.")

    @model_validator(mode="after")
    def _times(self) -> ProfilePoint:
        if not self.out_of_memory and (self.forward_s is None or self.backward_s is None):
            raise ValueError("a point that is not out_of_memory needs forward_s and backward_s")
        return self

    @property
    def key(self) -> Key:
        return (self.gpu_type, self.tp, self.micro_batch, self.precision)


class ProfiledModel(_Strict):
    """Shapes of the model the layers were built from."""

    name: str
    num_layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    ffn_hidden: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    activation: str


class DeviceInfo(_Strict):
    """Where it was measured."""

    name: str = Field(description="Device name as the driver reports it (or the CPU).")
    kind: Literal["cuda", "cpu", "other"] = "cuda"
    count: int = Field(default=1, ge=1, description="Devices used (= the largest tp measured).")
    gpu_type: str = Field(description="Catalog GPU name recorded in the points.")
    driver_version: str | None = None
    cuda_version: str | None = None
    cudnn_version: str | None = None
    torch_version: str | None = None
    python_version: str | None = None
    platform: str | None = None


class ProfileHeader(_Strict):
    model: ProfiledModel
    device: DeviceInfo
    created: str = Field(description="UTC time of the measurement, ISO 8601.")
    tool: str = Field(description="Tool and version that measured, e.g. 'haap-milp 0.1.0'.")
    memory_method: MemoryMethod = "none"
    timing_method: str = ""
    warmup: int = Field(default=0, ge=0)
    repeats: int = Field(default=0, ge=0)
    notes: list[str] = Field(default_factory=list)


class NativeProfile(_Strict):
    """A measured profile in the native format (``haap-solve schema profile``)."""

    format: Literal["haap-profile"] = FORMAT_NAME
    version: Literal[2] = FORMAT_VERSION
    header: ProfileHeader
    points: list[ProfilePoint]

    def precisions(self) -> list[str]:
        return sorted({p.precision for p in self.points})

    def seq_lens(self) -> list[int]:
        return sorted({p.seq_len for p in self.points})


def profile_schema() -> dict[str, Any]:
    return NativeProfile.model_json_schema()


def is_native_json(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT_NAME


def parse_native(data: Any, where: str) -> NativeProfile:
    try:
        return NativeProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise HaapInputError(f"profile {where}: {loc}: {first['msg']} ({exc.error_count()} error(s); "
                             "`haap-solve schema profile` shows the format).", field=f"profile.{loc}",
                             value=where) from None


def read_native(path: str | Path) -> NativeProfile:
    """A native JSON profile, read by the shared safe loader (size, depth and UTF-8 bounds)."""
    return parse_native(load_data(Path(path), "profile"), repr(str(path)))


def _pick(values: list[Any], wanted: Any, what: str, where: str) -> Any:
    if wanted is not None:
        if wanted not in values:
            raise HaapInputError(f"profile {where} has no points at {what} {wanted} (it has "
                                 f"{', '.join(map(str, values)) or 'none'}); measure it with `haap-solve profile "
                                 f"--{what.replace('_', '-')}s ...` or train at a measured {what}.",
                                 field=f"profile.{what}", value=wanted)
        return wanted
    if len(values) != 1:
        raise HaapInputError(f"profile {where} holds several {what}s ({', '.join(map(str, values))}); say which "
                             f"one to use.", field=f"profile.{what}", value=where)
    return values[0]


def to_profile(native: NativeProfile, precision: str | None = None, seq_len: int | None = None,
               where: str = "") -> Profile:
    """The ``Profile`` (override.py's input) of the points at ``precision`` and ``seq_len`` (module doc)."""
    where = where or repr(native.header.model.name)
    from haap_milp.catalog import data as cat  # catalog imports the estimator package; resolve lazily

    prec = _pick(native.precisions(), precision, "precision", where)
    seq = _pick(native.seq_lens(), seq_len, "seq_len", where) if native.points else None
    by_key: dict[tuple[str, int, int], dict[str, ProfilePoint]] = defaultdict(dict)
    oom: set[Key] = set()
    for i, pt in enumerate(native.points):
        gpu = cat.canonical("GPU", pt.gpu_type)
        if gpu is None:
            raise HaapInputError(f"profile {where}: points[{i}].gpu_type {pt.gpu_type!r} is not a catalog GPU "
                                 "(`haap-solve catalog gpus`).", field=f"points[{i}].gpu_type", value=pt.gpu_type)
        if pt.precision != prec or pt.seq_len != seq:
            continue
        if pt.out_of_memory:
            oom.add((gpu, pt.tp, pt.micro_batch, prec))
            continue
        kinds = by_key[(gpu, pt.tp, pt.micro_batch)]
        if pt.layer_kind in kinds:  # (the later one would win silently)
            raise HaapInputError(f"profile {where}: points[{i}] measures {pt.layer_kind} on {gpu} at tp {pt.tp}, "
                                 f"micro-batch {pt.micro_batch}, {prec}, seq_len {seq} again; keep one.",
                                 field=f"points[{i}]", value=where)
        kinds[pt.layer_kind] = pt
    notes = [UNCOVERED_POLICY]
    entries: dict[tuple[str, int, int], ProfileEntry] = {}
    optimizer: dict[tuple[str, int, int], float] = {}
    fb = lambda pt: None if pt is None else pt.forward_s + pt.backward_s
    for key, kinds in sorted(by_key.items()):
        if key + (prec,) in oom:
            continue  # one layer kind did not fit: the whole option is out of memory
        dec = kinds.get("decoder")
        layer_t, layer_mem = fb(dec), None if dec is None else dec.peak_memory_bytes
        if dec is None and "attention" in kinds and "mlp" in kinds:
            layer_t = fb(kinds["attention"]) + fb(kinds["mlp"])
            notes.append(f"{key}: decoder time = attention + mlp; their memory is not combined (analytic)")
        if layer_t is None:
            notes.append(f"{key}: no decoder (or attention + mlp) point; analytic model for this key")
            continue
        emb, head = kinds.get("embedding"), kinds.get("head")
        entries[key] = ProfileEntry(key[0], key[1], key[2], layer_t, fb(emb), fb(head), _f(layer_mem),
                                    None if emb is None else _f(emb.peak_memory_bytes),
                                    None if head is None else _f(head.peak_memory_bytes))
        if dec is not None and dec.optimizer_s is not None:
            optimizer[key] = dec.optimizer_s
    covered = frozenset(k + (prec,) for k in entries)
    if oom:
        notes.append(f"{len(oom)} out-of-memory key(s) left out of the entries (never priced from the profile)")
    meta = {"precision": prec, "covered_keys": covered, "oom_keys": frozenset(oom), "optimizer_s": optimizer,
            "notes": notes, "header": native.header.model_dump(mode="json")}
    h = native.header
    source = f"native profile {where}: {h.device.name} as {h.device.gpu_type}, {h.tool}, {h.created}"
    return Profile(entries, source=source, seq_len=seq, num_layers=h.model.num_layers, meta=meta)


def _f(x: int | None) -> float | None:
    return None if x is None else float(x)


def load_native_json(path: str | Path, precision: str | None = None, seq_len: int | None = None) -> Profile:
    """Read a native JSON profile and select ``precision`` / ``seq_len`` (each may be None when the file has
    only one); meta carries covered_keys, oom_keys, optimizer_s and notes (module doc)."""
    return to_profile(read_native(path), precision, seq_len, repr(str(path)))


def load_profile(path: str | Path, device_map: dict[str, str] | None = None, precision: str | None = None) -> Profile:
    """Any profile: a Metis directory, a native JSON profile (its points at ``precision``) or the YAML form."""
    if is_dir(path):
        return load_metis_dir(path, device_map)
    data = load_data(Path(path), "profile")
    if is_native_json(data):
        return to_profile(parse_native(data, repr(str(path))), precision, None, repr(str(path)))
    return native_from_data(data, path)


def _device_map(devices: dict[str, str] | None) -> dict[str, str]:
    from haap_milp.catalog import data as cat

    out = {}
    for name, gpu in (devices or {}).items():
        canon = cat.canonical("GPU", gpu)
        if canon is None:
            raise HaapInputError(f"--profile-device {name}={gpu}: {gpu!r} is not a catalog GPU (`haap-solve catalog "
                                 "gpus`).", field="profile_device", value=f"{name}={gpu}")
        out[name] = canon
    return out


def load_profiles(paths: list[str | Path] | tuple[str | Path, ...] | str | Path,
                  device_map: dict[str, str] | None = None, precision: str | None = None,
                  fallback: str = "none") -> Profile:
    """One ``Profile`` from one or several profiles (Metis directories, native JSON, YAML form), with the
    fallback policy for points none of them covers (``estimator.override``). The same (gpu, tp, mbs) point in
    two files with different values, or an out-of-memory point measured fine in another file, is an error
    naming both files; so are different sequence lengths, layer counts or precisions, a ``device_map`` name
    no Metis directory has, and a GPU type that is not in the catalog."""
    from dataclasses import replace

    from haap_milp.catalog import data as cat
    from haap_milp.estimator.override import check_fallback

    check_fallback(fallback)
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise HaapInputError("no profile given.", field="profile")
    devices = _device_map(device_map)
    entries: dict[tuple[str, int, int], ProfileEntry] = {}
    oom: dict[tuple[str, int, int], str] = {}
    origin: dict[tuple[str, int, int], str] = {}
    seen: dict[str, tuple[Any, str]] = {}
    sources, notes, metis_devices = [], [], set()
    named = None  # the first native profile's model (its name and shape)
    for path in paths:
        where = str(path)
        prof = load_profile(path, devices, precision)
        metis_devices.update(prof.meta.get("devices", ()))
        sources.append(prof.source)
        notes += [n for n in prof.meta.get("notes", ()) if n != UNCOVERED_POLICY]
        model = (prof.meta.get("header") or {}).get("model")  # (a native profile's model: the estimator checks it)
        shape = None if model is None else {k: v for k, v in model.items() if k != "name"}
        for what, value in (("seq_len", prof.seq_len), ("number of layers", prof.num_layers),
                            ("precision", prof.meta.get("precision")), ("model shape", shape)):
            if value is None:
                continue
            if what in seen and seen[what][0] != value:
                raise HaapInputError(f"profiles {seen[what][1]!r} and {where!r} disagree on the {what} "
                                     f"({seen[what][0]} vs {value}); give profiles of one training setup.",
                                     field="profile", value=where)
            seen.setdefault(what, (value, where))
        named = named or model
        for e in prof.entries.values():
            gpu = cat.canonical("GPU", e.gpu)
            if gpu is None:
                raise HaapInputError(f"profile {where!r}: GPU type {e.gpu!r} is not a catalog GPU (`haap-solve "
                                     "catalog gpus`).", field="profile.gpu", value=e.gpu)
            e = replace(e, gpu=gpu)
            key = (gpu, e.tp, e.mbs)
            if key in oom:
                raise HaapInputError(f"profiles {origin[key]!r} and {where!r} disagree on {gpu} at tp {e.tp}, "
                                     f"micro-batch {e.mbs}: out of memory in one, measured in the other.",
                                     field="profile", value=where)
            if key in entries and entries[key] != e:
                raise HaapInputError(f"profiles {origin[key]!r} and {where!r} both hold {gpu} at tp {e.tp}, "
                                     f"micro-batch {e.mbs} with different values; keep one of them.",
                                     field="profile", value=where)
            entries[key], origin[key] = e, where
        for k in prof.oom_points():
            if k in entries:
                raise HaapInputError(f"profiles {origin[k]!r} and {where!r} disagree on {k[0]} at tp {k[1]}, "
                                     f"micro-batch {k[2]}: measured in one, out of memory in the other.",
                                     field="profile", value=where)
            oom[k], origin[k] = where, where
    unused = sorted(set(devices) - metis_devices)
    if unused:
        raise HaapInputError(f"--profile-device {unused[0]}={devices[unused[0]]}: no Metis profile directory given has "
                             f"device type {unused[0]!r} (they have {', '.join(sorted(metis_devices)) or 'none'}).",
                             field="profile_device", value=unused[0])
    prec = seen.get("precision", (None,))[0]
    meta = {"sources": sources, "notes": notes, "oom_keys": frozenset(k + (prec,) for k in oom),
            "covered_keys": frozenset(k + (prec,) for k in entries)}
    if prec is not None:
        meta["precision"] = prec
    if named is not None:
        meta["header"] = {"model": named}
    return Profile(entries, source="; ".join(sources), seq_len=seen.get("seq_len", (None,))[0],
                   num_layers=seen.get("number of layers", (None,))[0], meta=meta, fallback=fallback)
