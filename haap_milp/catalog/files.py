"""Reading user files safely: size, binary, encoding, YAML/JSON syntax, non-finite numbers.

Every failure becomes one ``HaapInputError`` paragraph naming the file and what would work.
YAML goes through a ``yaml.SafeLoader`` whose document is measured before it is built: aliases
(anchors reused with ``*name``) may not expand it beyond ``MAX_YAML_NODES`` nodes (a "billion laughs"
alias bomb is refused in milliseconds), and cyclic aliases are refused. JSON and YAML nesting is
bounded (``MAX_DEPTH``), files by size (``MAX_FILE_BYTES``); every loader in the package goes
through ``load_data`` / ``parse_text``.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from haap_milp.errors import HaapInputError

MAX_FILE_BYTES = 8 * 2**20  # model/cluster/plan files are kilobytes; refuse anything absurd
# YAML is composed node by node in Python (about 2 CPU s per MiB with libyaml, 7 without): a YAML input is
# kilobytes (the largest, a measured network, ~10 KiB), so beyond 2 MiB it is refused before parsing
MAX_YAML_BYTES = 2 * 2**20
MAX_YAML_NODES = 200_000  # after alias expansion; the largest real input (a bench spec) has a few hundred
MAX_ITEMS = 10_000  # keys of one mapping / items of one list; real inputs have at most a few hundred
MAX_DEPTH = 100  # nesting levels of lists/mappings; real inputs have fewer than 6
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


def is_file(path: str | Path) -> bool:
    """``Path.is_file`` that says False instead of raising for a name the OS refuses (too long, NUL): the caller then
    reports "not a file" naming its flag (pathlib swallows only missing-file errors)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: str | Path) -> bool:
    """``Path.is_dir``, False for a name the OS refuses (see ``is_file``)."""
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
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


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where installed: ~3x faster


class _BoundedLoader(_SAFE_LOADER):  # type: ignore[valid-type,misc]
    """SafeLoader; ``load_yaml`` measures the composed node graph before constructing it. A key given twice in one
    mapping is an error (PyYAML keeps the last silently: ``num_layers`` twice was read as the second)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # (``<<: *base``: its keys may be overridden)
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the constructor's own error follows
                    continue
                if seen is not key_node:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {short(key)} is given twice in one mapping, at lines "
                        f"{seen.start_mark.line + 1} and {key_node.start_mark.line + 1}; keep one")
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: yaml.Node, name: str) -> int:
    """Nodes in the document once every alias is expanded (memoised; iterative, so no recursion limit);
    refuses cycles and anything beyond ``MAX_YAML_NODES``."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children: list[yaml.Node] = [c for pair in node.value for c in pair] \
            if isinstance(node, yaml.MappingNode) else list(node.value)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > MAX_YAML_NODES:
                raise HaapInputError(f"{name!r} expands to more than {MAX_YAML_NODES} values once its YAML aliases "
                                     "(*name) are expanded; write the values out or use fewer aliases.",
                                     field="path", value=name)
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path or len(on_path) > MAX_DEPTH:
            what = "refers to itself through a YAML alias" if key in on_path else \
                f"is nested more than {MAX_DEPTH} levels deep"
            raise HaapInputError(f"{name!r} {what}; inputs are plain mappings and lists.", field="path", value=name)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def load_yaml(text: str, name: str) -> Any:
    """``yaml.safe_load`` with alias expansion, nesting and size bounded (see the module doc)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise HaapInputError(f"{name!r} is {size} bytes of YAML; YAML inputs larger than {MAX_YAML_BYTES} bytes are "
                             "refused (a model, cluster, network or spec file is a few kilobytes; a large table can "
                             "be given as .json).", field="path", value=name)
    _json_depth(text, name)  # flow [ { nesting, before PyYAML's recursive parser spends seconds on it
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, name)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_json(text: str, name: str) -> Any:
    """``json.loads`` with nesting bounded before parsing (brackets outside strings counted); a key given twice in one
    object is an error, as in YAML (``json`` keeps the last silently)."""
    _json_depth(text, name)

    def once(pairs: list) -> dict:
        out: dict = {}
        for k, v in pairs:
            if k in out:
                raise HaapInputError(f"{name!r}: key {short(k)} is given twice in one object; keep one.",
                                     field="path", value=name)
            out[k] = v
        return out

    return json.loads(text, object_pairs_hook=once)


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\']|\'\')*\'|[\[\]{}]')  # strings skipped


def _json_depth(text: str, name: str) -> None:
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth = 0
    for m in _JSON_TOKENS.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                raise HaapInputError(f"{name!r} is nested more than {MAX_DEPTH} levels deep; a model, cluster, plan "
                                     "or calibration file is a few levels of objects and lists.",
                                     field="path", value=name)
        elif tok in ("]", "}"):
            depth -= 1


def parse_text(text: str, name: str, fmt: str) -> Any:
    """Parse YAML (``fmt='yaml'``) or JSON text; then reject NaN/inf anywhere."""
    try:
        data = load_json(text, name) if fmt == "json" else load_yaml(text, name)
    except HaapInputError:
        raise
    except json.JSONDecodeError as exc:
        msg = exc.msg.removesuffix(" at")  # ("Unterminated string starting at": its position follows)
        raise HaapInputError(f"{name!r} is not valid JSON: {msg} at line {exc.lineno}, column {exc.colno}.",
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
    """Read and parse a YAML or JSON file (by suffix). A parse error is said as the ``what`` (a flag or a kind of
    file) it was given as, e.g. "prices file: '...' expands to more than ... values"."""
    name = str(path)
    text = read_text(name, what)
    try:
        return parse_text(text, name, suffix_format(name))
    except HaapInputError as exc:
        if what == "file" or str(exc).startswith(what):
            raise
        raise HaapInputError(f"{what}: {exc}", field=exc.field, value=exc.value) from None


def check_finite(data: Any, name: str, path: str = "", depth: int = 0, seen: set[int] | None = None) -> None:
    """Reject NaN and infinities (YAML .nan/.inf, JSON NaN/Infinity) with the field path. A list or mapping that
    YAML's aliases share is walked once (``seen``: ids of those walked; the error names its first path): an
    alias-heavy document within MAX_YAML_NODES took 2.8 M calls here, one per expanded value."""
    if seen is None:
        seen = set()
    if isinstance(data, (dict, list)):
        if id(data) in seen:
            return
        seen.add(id(data))
    if depth > MAX_DEPTH:
        raise HaapInputError(f"{name!r} is nested too deeply (more than {MAX_DEPTH} levels).", field=path or None)
    if isinstance(data, float) and not math.isfinite(data):
        raise HaapInputError(f"{name!r}: field {path or '(top level)'} is {data!r}; give a finite number.",
                             field=path or None, value=data)
    if isinstance(data, (dict, list)) and len(data) > MAX_ITEMS:
        raise HaapInputError(f"{name!r}: {'field ' + path if path else 'the top level'} has {len(data)} "
                             f"{'keys' if isinstance(data, dict) else 'items'}; more than {MAX_ITEMS} is refused "
                             "(a model, cluster, plan or spec file has a few hundred at most).", field=path or None)
    if isinstance(data, dict):
        for key, value in data.items():
            check_finite(value, name, f"{path}.{key}" if path else str(key), depth + 1, seen)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            check_finite(value, name, f"{path}.{i}" if path else str(i), depth + 1, seen)


def require_mapping(data: Any, name: str, what: str, field: str = "", *, context: bool = False) -> dict[str, Any]:
    """The data as a dict with string keys, or one paragraph saying what was found instead. ``name``: a file name
    (quoted here), or with ``context`` a phrase that already quotes it ("model file 'm.json'")."""
    label = name if context else repr(name)
    where = f"field {field} of {label}" if field else label
    if not isinstance(data, dict):
        found = "empty" if data is None else f"a {type(data).__name__} ({short(data)})"
        raise HaapInputError(f"{where} should be a mapping ({what}); it is {found}.", field=field or None, value=data)
    for key in data:
        if not isinstance(key, str):
            raise HaapInputError(f"{where} has a non-text key {short(key)}; keys are field names such as "
                                 f"'num_layers'.", field=field or None, value=key)
    return data
