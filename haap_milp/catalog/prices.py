"""Prices and board power per GPU type: the catalog's ``prices.yaml`` and a user's ``--prices FILE`` on top.

File format (both)::

    default_idle_fraction: 0.15          # optional: idle_w = fraction x tdp_w where a row gives no idle_w
    gpus:
      a100-80g: {on_demand_usd_per_gpu_hour: 2.0, spot_usd_per_gpu_hour: 1.1, idle_w: 60, tdp_w: 400}

A user row replaces only the keys it gives. GPU names are looked up like everywhere else (aliases, case);
a name the catalog does not know is kept as written (a GPU defined inline in a cluster YAML); the commands warn
when the cluster has no GPU of that name either (``unpriced_custom``: most often a typo). The formulas
that use these numbers live in ``haap_milp/economics.py``.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from haap_milp.catalog.data import builtin_yaml
from haap_milp.errors import HaapInputError

PRICE_KINDS = ("on_demand", "spot")
ROW_KEYS = ("on_demand_usd_per_gpu_hour", "spot_usd_per_gpu_hour", "idle_w", "tdp_w", "instance")
TOP_KEYS = ("gpus", "default_idle_fraction", "date", "provider")


@dataclass(frozen=True)
class GpuRates:
    """One GPU type: $ per GPU-hour (on demand, spot) and board power (W); None = not known."""

    on_demand_usd_per_gpu_hour: float | None = None
    spot_usd_per_gpu_hour: float | None = None
    idle_w: float | None = None  # None: default_idle_fraction x tdp_w
    tdp_w: float | None = None


@dataclass(frozen=True)
class PriceBook:
    """What ``economics`` prices with: which price (``kind``), the rows, and where they came from."""

    kind: str
    gpus: dict[str, GpuRates]
    default_idle_fraction: float
    source: str
    custom: tuple[str, ...] = ()  # the --prices file's GPU names the catalog lacks, as written (``unpriced_custom``)

    def usd_per_gpu_hour(self, gpu_type: str) -> float | None:
        row = self.gpus.get(gpu_type)
        return None if row is None else getattr(row, f"{self.kind}_usd_per_gpu_hour")

    def tdp_w(self, gpu_type: str) -> float | None:
        row = self.gpus.get(gpu_type)
        return None if row is None else row.tdp_w

    def idle_w(self, gpu_type: str) -> float | None:
        row = self.gpus.get(gpu_type)
        if row is None:
            return None
        if row.idle_w is not None:
            return row.idle_w
        return None if row.tdp_w is None else self.default_idle_fraction * row.tdp_w


# Upper bounds, far above any real figure, so that a typo (1e300) never reaches the cost and energy sums: $ per
# GPU-hour ~1000x the dearest list price (~$12 for an H200 on demand); watts ~100x a B200 board's 1.2 kW TDP
MAX_USD_PER_GPU_HOUR = 1e4
MAX_WATTS = 1e5
MOST = {"on_demand_usd_per_gpu_hour": MAX_USD_PER_GPU_HOUR, "spot_usd_per_gpu_hour": MAX_USD_PER_GPU_HOUR,
        "idle_w": MAX_WATTS, "tdp_w": MAX_WATTS, "default_idle_fraction": 1.0}


def _number(value: Any, where: str, name: str) -> float | None:
    if value is None:
        return None
    most = MOST[where.rsplit(".", 1)[-1]]
    if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()) and math.isfinite(float(value)):
        # PyYAML (YAML 1.1) reads 1e3 or 2.5e3 (no '.' in the mantissa, or no sign in the exponent) as text
        raise HaapInputError(f"{name}: {where} = {value!r} is text, not a number: YAML reads this exponent form as "
                             f"a string; write {_yaml_float(value)}", field=where, value=value)
    if isinstance(value, str) and _is_float_text(value) and math.isfinite(float(value)):
        raise HaapInputError(f"{name}: {where} = {value!r} is a quoted number (text); write it without quotes",
                             field=where, value=value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise HaapInputError(f"{name}: {where} = {value!r} must be a number >= 0 (or null for unknown)",
                             field=where, value=value)
    if value > most:
        raise HaapInputError(f"{name}: {where} = {value:g} is more than {most:g}", field=where, value=value)
    return float(value)


_EXPONENT = re.compile(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+")  # a number with an exponent, as people write it


def _is_float_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _yaml_float(text: str) -> str:
    """'1e300' as YAML 1.1 reads a float: '1.0e+300' (a mantissa with a '.', a signed exponent)."""
    mantissa, _, exp = text.strip().lower().partition("e")
    if not exp:
        return text
    mantissa = mantissa if "." in mantissa else f"{mantissa}.0"
    return f"{mantissa}e{exp if exp[0] in '+-' else '+' + exp}"


def _rows(doc: Any, name: str) -> tuple[dict[str, dict], float | None, dict[str, str]]:
    """The rows by canonical GPU name, default_idle_fraction, and each row's GPU name as written."""
    from haap_milp.catalog import data as cat

    if not isinstance(doc, dict):
        got = "an empty file" if doc is None else f"a {type(doc).__name__}"
        raise HaapInputError(f"{name}: a prices file is a mapping with a 'gpus' key, got {got}", field="gpus")
    extra = sorted(set(doc) - set(TOP_KEYS))
    if extra:
        raise HaapInputError(f"{name}: unknown key {extra[0]!r} (allowed: {', '.join(TOP_KEYS)})", field=extra[0])
    frac = _number(doc.get("default_idle_fraction"), "default_idle_fraction", name)
    gpus = doc.get("gpus") or {}
    if not isinstance(gpus, dict):
        raise HaapInputError(f"{name}: 'gpus' must map GPU names to rows, got {type(gpus).__name__}", field="gpus")
    out: dict[str, dict] = {}
    spelled: dict[str, str] = {}
    for gpu, row in gpus.items():
        where = f"gpus.{gpu}"
        if not isinstance(row, dict):
            raise HaapInputError(f"{name}: {where} must be a mapping of {', '.join(ROW_KEYS)}", field=where)
        bad = sorted(set(row) - set(ROW_KEYS))
        if bad:
            raise HaapInputError(f"{name}: unknown key {where}.{bad[0]} (allowed: {', '.join(ROW_KEYS)})",
                                 field=f"{where}.{bad[0]}")
        vals = {k: _number(row[k], f"{where}.{k}", name) for k in ROW_KEYS if k in row and k != "instance"}
        key = cat.canonical("GPU", str(gpu)) or str(gpu)
        out[key], spelled[key] = vals, str(gpu)
    return out, frac, spelled


def _check_power(row: GpuRates, where: str, name: str, given: dict) -> None:
    """A board idles below its full-load power: idle_w <= tdp_w (either one from the catalog where the row omits it)."""
    if row.idle_w is not None and row.tdp_w is not None and row.idle_w > row.tdp_w:
        whose = "" if {"idle_w", "tdp_w"} <= set(given) else " (the other from the catalog)"
        raise HaapInputError(f"{name}: {where}.idle_w = {row.idle_w:g} W is more than its tdp_w = {row.tdp_w:g} W"
                             f"{whose}; a GPU idles below its full-load power", field=f"{where}.idle_w",
                             value=row.idle_w)


@functools.lru_cache(maxsize=1)
def _catalog_doc() -> dict:
    return builtin_yaml("prices.yaml")


def price_kind(kind: str) -> str:
    """``--price``'s value as the book's key: on_demand | spot (``on-demand`` accepted as written on the CLI)."""
    k = str(kind).strip().lower().replace("-", "_")
    if k not in PRICE_KINDS:
        raise HaapInputError(f"--price {kind!r}: choose one of on-demand, spot", field="--price", value=kind)
    return k


@functools.lru_cache(maxsize=len(PRICE_KINDS))
def _catalog_book(kind: str) -> PriceBook:
    """The catalog's book alone, parsed once per kind (every report without --prices asks for it)."""
    doc = _catalog_doc()
    rows, frac, _ = _rows(doc, "prices.yaml")
    return PriceBook(kind, {g: GpuRates(**v) for g, v in rows.items()}, frac if frac is not None else 0.15,
                     f"catalog: {doc.get('provider')} ({doc.get('date')})")


def load_prices(path: str | None = None, kind: str = "on_demand") -> PriceBook:
    """The catalog's prices and power, with the rows of ``path`` (``--prices``) on top; ``kind``: ``--price``."""
    kind = price_kind(kind)
    base = _catalog_book(kind)
    if path is None:
        return base
    from haap_milp.catalog import data as cat
    from haap_milp.catalog.files import load_data

    book = dict(base.gpus)
    name = f"prices file {str(path)!r}"
    user, ufrac, spelled = _rows(load_data(path, "--prices"), name)
    for g, v in user.items():
        book[g] = replace(book.get(g, GpuRates()), **v)
        _check_power(book[g], f"gpus.{spelled[g]}", name, v)
    frac = ufrac if ufrac is not None else base.default_idle_fraction
    custom = tuple(spelled[g] for g in user if cat.canonical("GPU", g) is None)
    return PriceBook(kind, book, frac, f"{path} over the {base.source}", custom)


def unpriced_custom(book: PriceBook, gpu_types: tuple[str, ...]) -> list[str]:
    """The --prices rows that price nothing here: GPU names neither the catalog nor the cluster (``gpu_types``) has,
    most often a typo (the GPU then keeps the catalog's price), each with the catalog's closest names."""
    from haap_milp.catalog import data as cat
    from haap_milp.catalog.validation import suggest

    out = []
    for g in book.custom:
        if g not in gpu_types:
            close = suggest(g, cat.catalog().keys["GPU"])
            out.append(f"{g!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
    return out


def prices_schema() -> dict:
    """JSON schema of a --prices file (`haap-solve schema prices`)."""
    num = {"type": ["number", "null"], "minimum": 0}
    row = {"type": "object", "additionalProperties": False, "properties": {
        "on_demand_usd_per_gpu_hour": {**num, "description": "$ per GPU-hour, on demand."},
        "spot_usd_per_gpu_hour": {**num, "description": "$ per GPU-hour, spot (--price spot)."},
        "idle_w": {**num, "description": "Board power when idle, W (default: default_idle_fraction x tdp_w)."},
        "tdp_w": {**num, "description": "Board power at full load (datasheet TDP), W."},
        "instance": {"type": "string", "description": "Where the price comes from (ignored)."}}}
    return {"title": "prices", "type": "object", "additionalProperties": False, "properties": {
        "gpus": {"type": "object", "additionalProperties": row, "description": "GPU type (catalog name or alias) -> row."},
        "default_idle_fraction": {"type": "number", "minimum": 0, "maximum": 1},
        "date": {"type": "string"}, "provider": {"type": "string"}}}
