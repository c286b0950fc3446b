"""Frozen dataclasses as JSON and back: a dataclass as the object of its fields, enums by value, tuples as lists;
read back with every field checked against its declared type, so that what a ledger or a report hands back is what
was written, or a `ValueError` that says where it is not."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from enum import StrEnum
from functools import cache
from typing import Any, NoReturn, TypeAlias, TypeVar, Union, get_args, get_origin, get_type_hints

JSON: TypeAlias = bool | int | float | str | list["JSON"] | dict[str, "JSON"] | None
D = TypeVar("D")


def encode(value: object) -> JSON:
    """A dataclass, enum, tuple or mapping as JSON (a dataclass as an object of its fields)."""
    if isinstance(value, StrEnum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    raise TypeError(f"no JSON form for {type(value).__name__}")


def decode(kind: Callable[..., D], data: Mapping[str, JSON]) -> D:
    """A dataclass from the object of its fields, each checked against its declared type (raises ValueError)."""
    readers, required = _fields(kind)
    missing, unknown = required - data.keys(), data.keys() - readers.keys()
    if missing or unknown:
        raise ValueError(f"{getattr(kind, '__name__', kind)}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    return kind(**{name: readers[name](value, name) for name, value in data.items()})


Reader = Callable[[JSON, str], object]  # a JSON value (and where it is, for the error) -> the value of its type


@cache
def _fields(kind: Any) -> tuple[dict[str, Reader], frozenset[str]]:
    """A reader for each of a dataclass's fields, by its declared type, and the fields without a default."""
    hints = get_type_hints(kind)
    fields = dataclasses.fields(kind)
    return ({f.name: _reader(hints[f.name]) for f in fields},
            frozenset(f.name for f in fields if f.default is dataclasses.MISSING))


@cache
def _reader(hint: Any) -> Reader:
    """How to read a value of `hint` from JSON: worked out once per type, not per value."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        (inner,) = (_reader(a) for a in args if a is not type(None))
        return lambda value, where: None if value is None else inner(value, where)
    if origin is tuple:
        item = _reader(args[0])
        return lambda value, where: tuple(item(v, where) for v in _list(value, where))
    if origin is dict:
        entry = _reader(args[1])
        return lambda value, where: {k: entry(v, f"{where}.{k}") for k, v in as_object(value, where).items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda value, where: decode(hint, as_object(value, where))
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return lambda value, where: _member(hint, value, where)
    if hint is float:
        return _float
    if hint in (int, str, bool):
        return lambda value, where: value if type(value) is hint else _wrong(value, hint, where)
    raise TypeError(f"no JSON reader for {hint!r}")


def _member(enum: type[StrEnum], value: JSON, where: str) -> StrEnum:
    if isinstance(value, str) and value in enum._value2member_map_:
        return enum(value)
    raise ValueError(f"{where}: {value!r} is no {enum.__name__}")


def _float(value: JSON, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return _wrong(value, float, where)


def _wrong(value: JSON, hint: type, where: str) -> NoReturn:
    raise ValueError(f"{where}: {value!r} is not {hint.__name__}")


def _list(value: JSON, where: str) -> list[JSON]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: not a list")
    return value


def as_object(value: JSON, where: str) -> dict[str, JSON]:
    """`value` where it is a JSON object (raises ValueError, naming `where`, where it is not)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: not an object")
    return value
