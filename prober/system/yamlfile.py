"""Reading a YAML file that a person (or an attacker) wrote: one-line errors, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from prober.domain.errors import YAMLFileError

MAX_DEPTH = 32  # configs are a few levels deep; far deeper is an accident or an attack
MAX_VALUES = 100_000


def read_yaml(path: Path) -> Any:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise YAMLFileError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise YAMLFileError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except ValueError as exc:  # a NUL in the path, or not UTF-8
        raise YAMLFileError(f"{path!r}: cannot read: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise YAMLFileError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    depth, size = shape(data)
    if depth > MAX_DEPTH:
        raise YAMLFileError(f"{path}: nested deeper than {MAX_DEPTH} levels (or an alias refers to itself)")
    if size > MAX_VALUES:
        raise YAMLFileError(f"{path}: its aliases expand to more than {MAX_VALUES:,} values")
    return data


def shape(data: Any) -> tuple[int, int]:
    """(depth, values once aliases are expanded) of parsed YAML, visiting each distinct node once: anchors
    make a document a graph, possibly cyclic (depth then counts as too deep), possibly exponential."""
    if not isinstance(data, dict | list):
        return 1, 1
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in memo:
            continue
        kids = [k for k in (node.values() if isinstance(node, dict) else node) if isinstance(k, dict | list)]
        if done:
            active.discard(key)
            scalars = len(node) - len(kids)
            memo[key] = (1 + max((memo[id(k)][0] for k in kids), default=1 if scalars else 0),
                         1 + scalars + sum(memo[id(k)][1] for k in kids))
            continue
        if key in active:
            return MAX_DEPTH + 1, 0
        active.add(key)
        stack.append((node, True))
        stack += [(k, False) for k in kids if id(k) not in memo]
    return memo[id(data)]
