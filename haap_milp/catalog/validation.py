"""pydantic ValidationError -> one-paragraph HaapInputError; name normalisation and "did you mean"."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from haap_milp.catalog.files import short
from haap_milp.errors import HaapInputError
from haap_milp.specs.base import BOOL_NOT_NUMBER

M = TypeVar("M", bound=BaseModel)
MAX_LISTED_PROBLEMS = 3


def normalize(name: str) -> str:
    """Case-, space-, dash- and underscore-insensitive key: 'Llama-3_70B' -> 'llama370b'."""
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def suggest(name: str, keys: dict[str, str], n: int = 3) -> list[str]:
    """Canonical names whose normalised key is close to ``name`` (difflib ratio >= 0.6)."""
    close = difflib.get_close_matches(normalize(name), list(keys), n=n * 3, cutoff=0.6)
    return list(dict.fromkeys(keys[k] for k in close))[:n]


def unknown_name_error(kind: str, name: str, keys: dict[str, str], listing: str, hint: str = "") -> HaapInputError:
    """One paragraph: unknown ``kind`` ``name``, close matches, where to see them all."""
    close = suggest(name, keys)
    tip = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return HaapInputError(
        f"unknown {kind} {short(name)}: {tip}run `haap-solve catalog {listing}` for the {listing} "
        f"it knows{hint}.", field=kind, value=name)


def loc_path(loc: tuple[int | str, ...]) -> str:
    """('node_groups', 0, 'num_nodes') -> 'node_groups.0.num_nodes'."""
    return ".".join(str(p) for p in loc)


def _unwrap(annotation: Any) -> Any:
    """The pydantic model class inside X | None, tuple[X, ...], list[X]; else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple, list):
        for arg in typing.get_args(annotation):
            found = _unwrap(arg)
            if found is not None:
                return found
    return None


def _tagged(field: Any, tag: Any) -> type[BaseModel] | None:
    """The member of the discriminated union ``field`` whose discriminator is ``tag``."""
    for member in typing.get_args(field.annotation):
        own = member.model_fields.get(field.discriminator) if isinstance(member, type) and issubclass(
            member, BaseModel) else None
        if own is not None and own.default == tag:
            return member
    return None


def user_loc(cls: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """``loc`` as the file spells it: pydantic puts a discriminated union's tag after the field
    (``links.0.curve.table.points``), a key no file holds; it is left out (``links.0.curve.points``)."""
    out: list[int | str] = []
    current: type[BaseModel] | None = cls
    tagged = None  # the discriminated-union field the previous part named
    for part in loc:
        if tagged is not None:
            current, tagged = _tagged(tagged, part), None
            continue
        out.append(part)
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part)
        if field is not None and field.discriminator is not None:
            tagged = field
        current = _unwrap(field.annotation) if field is not None else None
    return tuple(out)


def _model_at(cls: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that owns the last element of ``loc`` (for listing allowed keys)."""
    current: type[BaseModel] | None = cls
    for part in loc[:-1]:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        current = _unwrap(field.annotation) if field is not None else None
    return current


def describe_error(cls: type[BaseModel], err: Any) -> str:
    """One pydantic error as a phrase naming the field path and the value."""
    loc = user_loc(cls, tuple(err.get("loc", ())))
    path = loc_path(loc)
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        owner = _model_at(cls, loc)
        allowed = f"; allowed keys: {', '.join(owner.model_fields)}" if owner is not None else ""
        return f"unknown key {path!r}{allowed}"
    if kind == "missing":
        return f"field {path!r} is missing (required)"
    if kind == BOOL_NOT_NUMBER:  # raised on the model: its field is in the context
        ctx = err.get("ctx") or {}
        full = ".".join(p for p in (path, str(ctx.get("field", ""))) if p)
        return f"field {full!r} is {ctx.get('value')}; give a number (true/false is not one)"
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if not path:  # a model-level rule (e.g. heads must divide hidden): the message quotes the values
        return msg
    return f"field {path!r} = {short(err.get('input'))}: {msg}"


def _relevant(errors: list[Any]) -> list[Any]:
    """Unknown keys first; drop a container's error when an error inside it explains it (pydantic reports
    'tuple too short' for a list whose only item failed)."""
    locs = [tuple(e.get("loc", ())) for e in errors]
    parents = {loc[:i] for loc in locs for i in range(1, len(loc))}  # proper prefixes: O(n), not O(n^2)
    keep = [e for e, loc in zip(errors, locs) if not (loc and loc in parents)]
    return sorted(keep, key=lambda e: e.get("type") != "extra_forbidden")


def format_validation_error(cls: type[BaseModel], exc: ValidationError, context: str,
                            hint: str = "") -> HaapInputError:
    """The first few problems of ``exc`` in one paragraph, prefixed by ``context`` (``hint``: a closing remark)."""
    errors = _relevant(exc.errors(include_url=False))
    parts = [describe_error(cls, e) for e in errors[:MAX_LISTED_PROBLEMS]]
    more = len(errors) - MAX_LISTED_PROBLEMS
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else ""
    first = errors[0] if errors else {}
    return HaapInputError(f"{context}: {'; '.join(parts)}{tail}{f' {hint}' if hint else ''}.",
                          field=loc_path(user_loc(cls, tuple(first.get("loc", ())))) or None, value=first.get("input"))


def validate_spec(cls: type[M], data: Any, context: str) -> M:
    """``cls.model_validate(data)`` with errors turned into one HaapInputError paragraph."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(cls, exc, context) from None
