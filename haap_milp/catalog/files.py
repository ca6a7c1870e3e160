"""Reading user files safely: size, binary, encoding, YAML/JSON syntax, non-finite numbers.

Every failure becomes one ``HaapInputError`` paragraph naming the file and what would work.
YAML goes through ``yaml.safe_load`` only.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import yaml

from haap_milp.errors import HaapInputError

MAX_FILE_BYTES = 8 * 2**20  # model/cluster/plan files are kilobytes; refuse anything absurd
YAML_SUFFIXES = (".yaml", ".yml")
JSON_SUFFIXES = (".json",)


def short(value: object, limit: int = 60) -> str:
    """A one-line, bounded repr of a user value for error messages."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def looks_like_path(text: str) -> bool:
    """True when ``text`` names a file: it exists, has a path separator, or a data-file suffix."""
    if "/" in text or "\\" in text or text.lower().endswith(YAML_SUFFIXES + JSON_SUFFIXES):
        return True
    return path_exists(text)


def path_exists(text: str) -> bool:
    try:
        return os.path.lexists(text)
    except (OSError, ValueError):  # embedded NUL, name too long
        return False


def read_text(path: str | Path, what: str = "file") -> str:
    """The file's text, or a ``HaapInputError`` saying why it cannot be read as UTF-8 text."""
    name = str(path)
    try:
        p = Path(name)
        if p.is_dir():
            raise HaapInputError(
                f"{what} {name!r} is a directory; give the path of a file inside it (a .yaml or config.json).",
                field="path", value=name)
        if not p.exists():
            raise HaapInputError(f"{what} {name!r} does not exist; check the path (relative to {os.getcwd()!r}).",
                                 field="path", value=name)
        if not p.is_file():
            raise HaapInputError(f"{what} {name!r} is not a regular file.", field="path", value=name)
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise HaapInputError(f"{what} {name!r} is {size} bytes; inputs larger than {MAX_FILE_BYTES} bytes "
                                 "are refused (a model or cluster file is a few kilobytes).", field="path", value=name)
        data = p.read_bytes()
    except HaapInputError:
        raise
    except (OSError, ValueError) as exc:
        raise HaapInputError(f"cannot read {what} {short(name)}: {exc.__class__.__name__}: {short(str(exc), 200)}.",
                             field="path", value=name) from None
    return decode_text(data, name, what)


def decode_text(data: bytes, name: str, what: str = "file") -> str:
    """Strict UTF-8 decoding; NUL bytes mean a binary file."""
    if b"\x00" in data:
        raise HaapInputError(f"{what} {name!r} is binary (it contains NUL bytes at offset {data.index(0)}); "
                             "expected a UTF-8 text YAML or JSON file.", field="path", value=name)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HaapInputError(f"{what} {name!r} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                             f"{exc.start}); save it as UTF-8 YAML or JSON.", field="path", value=name) from None


def parse_text(text: str, name: str, fmt: str) -> Any:
    """Parse YAML (``fmt='yaml'``) or JSON text; then reject NaN/inf anywhere."""
    try:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise HaapInputError(f"{name!r} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.",
                             field="path", value=name) from None
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise HaapInputError(f"{name!r} is not valid YAML: {problem}{where}.", field="path", value=name) from None
    except RecursionError:
        raise HaapInputError(f"{name!r} is nested too deeply to be a model, cluster or plan file.",
                             field="path", value=name) from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. impossible YAML timestamps, huge ints
        raise HaapInputError(f"{name!r} could not be parsed as {fmt.upper()}: {short(str(exc), 120)}.",
                             field="path", value=name) from None
    check_finite(data, name)
    return data


def suffix_format(name: str) -> str:
    """'json' for .json files, 'yaml' otherwise (JSON is also valid YAML 1.2 for our purposes)."""
    return "json" if name.lower().endswith(JSON_SUFFIXES) else "yaml"


def load_data(path: str | Path, what: str = "file") -> Any:
    """Read and parse a YAML or JSON file (by suffix)."""
    name = str(path)
    return parse_text(read_text(name, what), name, suffix_format(name))


def check_finite(data: Any, name: str, path: str = "", depth: int = 0) -> None:
    """Reject NaN and infinities (YAML .nan/.inf, JSON NaN/Infinity) with the field path."""
    if depth > 100:
        raise HaapInputError(f"{name!r} is nested too deeply (more than 100 levels).", field=path or None)
    if isinstance(data, float) and not math.isfinite(data):
        raise HaapInputError(f"{name!r}: field {path or '(top level)'} is {data!r}; give a finite number.",
                             field=path or None, value=data)
    if isinstance(data, dict):
        for key, value in data.items():
            check_finite(value, name, f"{path}.{key}" if path else str(key), depth + 1)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            check_finite(value, name, f"{path}.{i}" if path else str(i), depth + 1)


def require_mapping(data: Any, name: str, what: str, field: str = "") -> dict[str, Any]:
    """The data as a dict with string keys, or one paragraph saying what was found instead."""
    where = f"field {field} of {name!r}" if field else repr(name)
    if not isinstance(data, dict):
        found = "empty" if data is None else f"a {type(data).__name__} ({short(data)})"
        raise HaapInputError(f"{where} should be a mapping ({what}); it is {found}.", field=field or None, value=data)
    for key in data:
        if not isinstance(key, str):
            raise HaapInputError(f"{where} has a non-text key {short(key)}; keys are field names such as "
                                 f"'num_layers'.", field=field or None, value=key)
    return data
