"""mkdocs hook: the repository's layout table, rendered at build time from the packages' own docstrings.

A page asks for it with `<!-- layout -->` on a line of its own and gets one row per package under `prober/` (any
depth) and per module at its top, each described by the first paragraph of its docstring, a package's row naming
its modules; then the paths outside the package, described in PATHS below (`tests/support/`, a package too, from
its docstring).  A hand-written table drifted as packages grew; this one changes with the code.  A package or
module without a docstring is a warning, which fails the strict build.  Docstrings are read with `ast`: nothing is
imported.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.layout")

MARKER = re.compile(r"^<!-- layout -->$", re.M)
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "prober"

# What lies outside the package, in reading order; None: the folder is a package, described by its docstring.
PATHS: tuple[tuple[str, str | None], ...] = (
    ("canaries/", "canary packs and filler corpora: data people edit without touching the code, shipped inside the "
                  "wheel (`prober/_data/canaries`)"),
    ("tests/", "the pytest suite: test modules and `conftest.py` only (fixtures, the markers that pick a tier, the "
               "scheduler of several workers); no test imports another test module or conftest "
               "(`tests/test_layout.py`); `tests/golden/` pins the metrics exposition and every report rendering "
               "(`LEAKPROBE_UPDATE_GOLDEN=1` to change them on purpose)"),
    ("tests/support/", None),
    ("bench/", "benchmarks, run by hand, printing figures ([Benchmarks](benchmarks.md))"),
    ("dashboards/", "the Prometheus alert rules with their promtool tests, and the Grafana dashboards"),
    ("examples/", "configuration files to start from (the daemon, the reference engine, Prometheus, Alertmanager), "
                  "each loaded by `tests/test_examples.py`"),
    ("helm/leakprobe/", "the Helm chart (its `dashboards` is a symlink to the repository's)"),
    ("docs/", "this site; `docs/hooks/` renders its generated parts at build time (the configuration reference, "
              "the engine bugs, this table)"),
    ("Dockerfile", "the daemon image"),
    (".ci/run", "CI's entry point: runs `make test`"),
)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda _: table(), markdown)


def table(root: Path = ROOT) -> str:
    rows = ["| path | what | modules |", "| --- | --- | --- |"]
    rows += [_row(path, what, modules) for path, what, modules in entries(root)]
    return "\n".join(rows)


Entry = tuple[str, str, list[str]]


def entries(root: Path = ROOT) -> list[Entry]:
    """(path, what, modules): the package, its packages and top-level modules, then PATHS."""
    top = root / PACKAGE
    name, what, _ = _package(top, root)
    found: list[Entry] = [(name, what, [])]  # its modules and packages have rows of their own
    found += [_package(init.parent, root) for init in sorted(top.rglob("*/__init__.py"))]
    found += [(_relative(module, root), _described(module, root), []) for module in sorted(top.glob("*.py"))
              if not module.name.startswith("__")]
    found.sort(key=lambda entry: entry[0])
    for path, text in PATHS:
        found.append(_package(root / path, root) if text is None else (path, text, []))
    return found


def first_paragraph(source: Path) -> str:
    """The docstring's first paragraph as one line, or "" where there is none."""
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""
    return re.sub(r"\s+", " ", doc.strip().split("\n\n", 1)[0]).strip()


def _package(folder: Path, root: Path) -> Entry:
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("__"))
    modules += sorted(p.name + "/" for p in folder.iterdir() if (p / "__init__.py").is_file())
    return _relative(folder, root) + "/", _described(folder / "__init__.py", root), modules


def _described(source: Path, root: Path) -> str:
    what = first_paragraph(source)
    if not what:
        log.warning("layout table: %s has no docstring: say in one to three sentences what it is for",
                    _relative(source, root))
    return what


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _row(path: str, what: str, modules: list[str]) -> str:
    cell = what.replace("|", "\\|")  # a pipe in a docstring would end the cell
    return f"| `{path}` | {cell} | {', '.join(f'`{m}`' for m in modules)} |"
