"""Frozen dataclasses as JSON and back: a dataclass as the object of its fields, enums by value, tuples as lists;
read back with every field checked against its declared type, so that what a ledger or a report hands back is what
was written, or a `ValueError` that says where it is not."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from enum import StrEnum
from functools import cache
from typing import Any, TypeAlias, TypeVar, Union, get_args, get_origin, get_type_hints

JSON: TypeAlias = bool | int | float | str | list["JSON"] | dict[str, "JSON"] | None
D = TypeVar("D")


def encode(value: object) -> JSON:
    """A dataclass, enum, tuple or mapping as JSON (a dataclass as an object of its fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"no JSON form for {type(value).__name__}")


def decode(kind: Callable[..., D], data: Mapping[str, JSON]) -> D:
    """A dataclass from the object of its fields, each checked against its declared type (raises ValueError)."""
    hints, required = _fields(kind)
    missing, unknown = required - data.keys(), data.keys() - hints.keys()
    if missing or unknown:
        raise ValueError(f"{getattr(kind, '__name__', kind)}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    return kind(**{name: _value(hints[name], value, name) for name, value in data.items()})


@cache
def _fields(kind: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """A dataclass's fields' declared types, and the fields without a default."""
    hints = get_type_hints(kind)
    fields = dataclasses.fields(kind)
    return ({f.name: hints[f.name] for f in fields},
            frozenset(f.name for f in fields if f.default is dataclasses.MISSING))


def _value(hint: Any, value: JSON, where: str) -> object:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = (a for a in args if a is not type(None))
        return _value(inner, value, where)
    if origin is tuple:
        return tuple(_value(args[0], v, where) for v in _list(value, where))
    if origin is dict:
        return {k: _value(args[1], v, f"{where}.{k}") for k, v in as_object(value, where).items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return decode(hint, as_object(value, where))
    if isinstance(hint, type) and issubclass(hint, StrEnum) and isinstance(value, str):
        try:
            return hint(value)
        except ValueError:
            raise ValueError(f"{where}: {value!r} is no {hint.__name__}") from None
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and type(value) is hint:
        return value
    raise ValueError(f"{where}: {value!r} is not {getattr(hint, '__name__', hint)}")


def _list(value: JSON, where: str) -> list[JSON]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: not a list")
    return value


def as_object(value: JSON, where: str) -> dict[str, JSON]:
    """`value` where it is a JSON object (raises ValueError, naming `where`, where it is not)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: not an object")
    return value
