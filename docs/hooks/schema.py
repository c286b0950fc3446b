"""mkdocs hook: the configuration reference, rendered from the pydantic models at build time.

A page asks for a model with a marker on a line of its own,

    <!-- schema: prober.config.schema:ProberConfig -->
    <!-- schema: prober.testbed.config:EngineConfig anchor=testbed -->
    <!-- schema: prober.checks:REGISTRY -->      (the sections the registered checks bring)
    <!-- env: prober.config.schema:ENV_OVERRIDES -->

and gets one table per section (key, type and limits, default, description), so the reference cannot drift
from the code: a key added to a model appears on the next build, and a key without a description (its
docstring or `Field(description=...)`) is a warning, which fails the strict build.
"""

from __future__ import annotations

import importlib
import logging
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

log = logging.getLogger("mkdocs.hooks.schema")

MARKER = re.compile(r"^<!-- (schema|env): ([\w.]+):(\w+)((?: \w+=[\w-]+)*) -->$", re.M)
_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))


@dataclass(frozen=True)
class Row:
    key: str
    kind: str
    default: str
    description: str


@dataclass(frozen=True)
class Section:
    path: str  # dotted, `[]` after a list of models; "" for the top level
    anchor: str
    doc: str
    rows: list[Row]


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(_render_marker, markdown)


def _render_marker(match: re.Match[str]) -> str:
    what, module, name, options = match.groups()
    target = getattr(importlib.import_module(module), name)
    settings = dict(opt.split("=", 1) for opt in options.split())
    if what == "env":
        return _env_table(target)
    prefix = settings.get("anchor", "")
    if isinstance(target, type) and issubclass(target, BaseModel):
        return "\n\n".join(_section_markdown(s) for s in sections(target, prefix))
    # a registry of checks: the sections its checks bring, each under its check's name
    found = [s for name, model in target.sections.items() for s in sections(model, prefix, name)]
    return "\n\n".join(_section_markdown(s) for s in found) or "No registered check brings a section of its own."


def sections(model: type[BaseModel], prefix: str = "", path: str = "") -> Iterator[Section]:
    """The model's own fields first, then each nested model's, depth first (the order a YAML file reads);
    `prefix` starts every anchor (two schemas on one page)."""
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{path}.{field.alias or name}" if path else field.alias or name
        child = _model_of(field.annotation)
        default = _default(field)
        if child is not None:
            child_path = key + ("[]" if get_origin(field.annotation) is list else "")
            nested.append((child, child_path))
            default = ("required, " if field.is_required() else "") + f"[see below](#{anchor(prefix, child_path)})"
        if not field.description:
            log.warning("configuration reference: %s.%s (%s) has no description: give it a docstring or "
                        "Field(description=...)", model.__module__, model.__qualname__, key)
        rows.append(Row(key, _kind(field, child), default, _one_line(field.description or "")))
    yield Section(path, anchor(prefix, path), _one_line(_own_doc(model)), rows)
    for child, child_path in nested:
        yield from sections(child, prefix, child_path)


def anchor(prefix: str, path: str) -> str:
    """`daemon.schedule` -> `daemon-schedule`, `targets[]` -> `targets`; the top level is `top-level`, or the
    prefix alone."""
    slug = re.sub(r"[^a-z0-9]+", "-", path.replace("[]", "").lower()).strip("-")
    return "-".join(filter(None, [prefix, slug])) or "top-level"


def _section_markdown(section: Section) -> str:
    title = f"`{section.path}`" if section.path else "Top level"
    lines = [f"### {title} {{#{section.anchor}}}", ""]
    if section.doc:
        lines += [section.doc, ""]
    lines += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r.key}` | {r.kind} | {r.default} | {r.description} |" for r in section.rows]
    return "\n".join(lines)


def _env_table(overrides: dict[str, tuple[str, ...]]) -> str:
    lines = ["| variable | sets |", "| --- | --- |"]
    lines += [f"| `{var}` | `{'.'.join(where)}` |" for var, where in overrides.items()]
    return "\n".join(lines)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (itself, or the items of a list), if it holds one."""
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _kind(field: FieldInfo, child: type[BaseModel] | None) -> str:
    if child is not None:
        return "list of mappings" if get_origin(field.annotation) is list else "mapping"
    kind = _type_name(field.annotation, field.metadata)
    limits = [text for item in field.metadata if (text := _limit(item))]
    return ", ".join([kind, *limits])


def _type_name(annotation: Any, metadata: list[Any] | None = None) -> str:
    if kind := _duration_kind(metadata or []):
        return kind
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0], list(args[1:]))
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        named = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or `null`" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"mapping of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{_enum_text(m)}`" for m in annotation)
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


# The validators that read durations (prober/config/sections.py), by the type the reference names.
_DURATIONS = {"parse_duration": "duration", "duration_or_off": "duration or `off`",
              "jitter_seconds": "duration or `off`"}


def _duration_kind(metadata: list[Any]) -> str | None:
    names = [getattr(getattr(item, "func", None), "__name__", "") for item in metadata]
    return next((_DURATIONS[n] for n in names if n in _DURATIONS), None)


def _is_duration(metadata: list[Any]) -> bool:
    return _duration_kind(metadata) is not None


def _limit(item: Any) -> str:
    for kind, attribute, sign in ((Gt, "gt", ">"), (Ge, "ge", "≥"), (Lt, "lt", "<"), (Le, "le", "≤")):
        if isinstance(item, kind):
            return f"{sign} {_number(getattr(item, attribute))}"
    if isinstance(item, MinLen):
        return f"at least {item.min_length}"
    if isinstance(item, MaxLen):
        return f"at most {item.max_length}"
    pattern = getattr(item, "pattern", None)
    return f"matching `{pattern}`" if pattern else ""


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default is PydanticUndefined:
        # A factory that is a type (list, dict, a model) gives the same value everywhere; a function may read the
        # machine it runs on (the replica's host name), so its value here would be this build's, not the reader's.
        factory = field.default_factory
        return _yaml(factory()) if isinstance(factory, type) else "computed (see description)"
    if _is_duration(field.metadata):
        return f"`{_duration(float(field.default))}`"
    return _yaml(field.default)


def _yaml(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        return f"`{_enum_text(value)}`"
    if isinstance(value, float | int):
        return f"`{_number(value)}`"
    if isinstance(value, dict):
        return "`{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}`" if value else "`{}`"
    if isinstance(value, list):
        return "`[]`" if not value else "`" + str(value) + "`"
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{value}`"


def _enum_text(member: Enum) -> str:
    """How a YAML file spells the member: a string enum by its value, another (Severity) by its name."""
    return member.value if isinstance(member.value, str) else member.name.lower()


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _duration(seconds: float) -> str:
    for unit, size in _UNITS:
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000)}ms"


def _own_doc(model: type[BaseModel]) -> str:
    """The class's own docstring, not one inherited from a base."""
    return model.__dict__.get("__doc__") or ""


def _one_line(text: str) -> str:
    """Docstrings wrap at the source's width; a table cell is one line (pipes escaped)."""
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")
