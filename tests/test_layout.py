"""The package's shape, checked on its source: no import cycle (between modules or between packages), the
dependency directions the design names, and no module, class or constructor that has grown past what one reader
holds in mind.  Imports are read with `ast`, type-checking-only ones included: a cycle there is a cycle in the
design even when Python can run it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent / "prober"
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 150
MAX_INIT_PARAMETERS = 6  # besides self

# package -> what it must never import (the design's one-way dependencies)
FORBIDDEN = {
    "prober.detect": ("prober.targets", "prober.probing", "prober.daemon", "prober.cli", "httpx"),
    "prober.targets": ("prober.detect", "prober.probing", "prober.daemon", "prober.cli", "prober.config",
                       "prober.canaries", "prober.report", "prober.oneshot"),
    "prober.canaries": ("prober.targets", "prober.probing", "prober.daemon", "prober.cli", "httpx"),
    "prober.ledger": ("prober.targets", "prober.probing", "prober.daemon", "prober.cli", "prober.detect"),
    "prober.probing": ("prober.checks", "prober.oneshot", "prober.daemon", "prober.cli", "prober.report"),
    "prober.checks": ("prober.oneshot", "prober.daemon", "prober.cli", "prober.report"),
    "prober.report": ("prober.daemon", "prober.cli", "prober.targets.transport"),
    "prober.daemon": ("prober.cli", "prober.oneshot"),
    "prober.oneshot": ("prober.daemon", "prober.cli"),
    "prober.testbed": ("prober.probing", "prober.checks", "prober.daemon", "prober.cli", "prober.detect"),
    "prober.lora": ("prober.targets", "prober.probing", "prober.checks", "prober.daemon", "prober.cli", "httpx"),
    "prober.input_embeds": ("prober.targets", "prober.probing", "prober.checks", "prober.testbed", "prober.detect",
                             "prober.daemon", "prober.cli", "httpx"),
    "prober.media": ("prober.targets", "prober.probing", "prober.checks", "prober.testbed", "prober.detect",
                     "prober.daemon", "prober.cli", "httpx"),
}

# the floors: the domain imports no other package of prober; text and system only the domain
PACKAGES = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
FORBIDDEN |= {"prober.domain": tuple(f"prober.{p}" for p in PACKAGES if p != "domain"),
              "prober.text": tuple(f"prober.{p}" for p in PACKAGES if p not in ("text", "domain")),
              "prober.system": tuple(f"prober.{p}" for p in PACKAGES if p not in ("system", "domain"))}


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (`from package import submodule` counts the submodule only: the
    package is already being imported when one of its own modules does that)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            submodules = {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known}
            found |= submodules
            if len(submodules) < len(node.names):  # names of the package itself, not only its submodules
                found.add(base)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {i for i in imports(name, path, known) if i in known and i != name} for name, path in mods.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def package_of(module: str) -> str:
    """prober.x.y -> prober.x (top-level modules of prober are their own package)."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_modules() -> None:
    found = cycle(graph())
    assert found is None, " -> ".join(found or [])


def test_no_import_cycle_between_packages() -> None:
    edges: dict[str, set[str]] = {}
    for source, targets in graph().items():
        edges.setdefault(package_of(source), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(source) and package_of(source) != "prober")
    found = cycle(edges)
    assert found is None, " -> ".join(found or [])


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package: str) -> None:
    mods = modules()
    known = set(mods)
    wrong = []
    for name, path in mods.items():
        if name == package or name.startswith(package + "."):
            for target in imports(name, path, known | {"httpx"}):
                if any(target == f or target.startswith(f + ".") for f in FORBIDDEN[package]):
                    wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(wrong)


def classes() -> Iterator[tuple[str, ast.ClassDef]]:
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                yield f"{name}.{node.name}", node


def test_no_module_outgrows_one_reader() -> None:
    long = [f"{name}: {lines} lines" for name, path in modules().items()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not long, "\n".join(long)


def test_no_class_outgrows_one_reader() -> None:
    long = [f"{name}: {node.end_lineno - node.lineno + 1} lines" for name, node in classes()
            if node.end_lineno and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]
    assert not long, "\n".join(long)


def test_no_constructor_takes_more_than_a_handful() -> None:
    wide = []
    for name, node in classes():
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                args = item.args
                count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) - 1
                if count > MAX_INIT_PARAMETERS:
                    wide.append(f"{name}.__init__: {count} parameters")
    assert not wide, "\n".join(wide)


def test_no_test_imports_another_test_module_or_conftest() -> None:
    """What tests share lives in tests/support (fixtures in conftest.py, which pytest loads itself): a test module
    imported by another runs its module-level code, and its tests' names, twice."""
    tests = ROOT.parent / "tests"
    wrong = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            wrong += [f"{path.relative_to(tests.parent)} imports {name}" for name in names
                      if name == "tests.conftest" or name.startswith("tests.test_")]
    assert not wrong, "\n".join(wrong)


def test_test_helpers_live_in_support() -> None:
    """tests/ holds test modules and conftest.py; every helper they share is in tests/support, one place to look."""
    tests = ROOT.parent / "tests"
    stray = [p.name for p in tests.glob("*.py") if p.name not in ("conftest.py", "__init__.py")
             and not p.name.startswith("test_")]
    assert not stray, f"helpers outside tests/support: {', '.join(sorted(stray))}"


def test_no_package_shares_a_name_with_a_check() -> None:
    """A word means one thing: `campaign` is a check of the registry, so no package is called that (the machinery
    every check runs on is `probing`)."""
    from prober.checks import REGISTRY

    clash = {check.name.replace("-", "_") for check in REGISTRY} & set(PACKAGES)
    assert not clash, f"packages named like a check: {sorted(clash)}"


def test_a_check_has_one_name_everywhere() -> None:
    """Its daemon job and metrics label (`name`), `--check NAME`, its config section, its module and its docs
    section are one string (`-` where Python needs `_`)."""
    import re

    from prober.checks import REGISTRY
    from prober.config.schema import ProberConfig

    sections = {field.alias or key for key, field in ProberConfig.model_fields.items()}
    shared = {"ledger", "targets", "tenants", "audit", "detection", "counters", "daemon", "tracing"}  # no one check's
    wrong = [f"section {s}: no check of that name" for s in sorted(sections - shared - {c.name for c in REGISTRY})]
    for check in REGISTRY:
        module = type(check).__module__.split(".")[2]  # its module, or its package for a big one
        if module != check.name.replace("-", "_"):
            wrong.append(f"{check.name}: module {module}")
        page = (ROOT.parent / "docs" / check.docs).read_text(encoding="utf-8")
        if not re.search(rf"^#+ .*\{{#{re.escape(check.name)}\}}$", page, re.M):
            wrong.append(f"{check.name}: no section {{#{check.name}}} in docs/{check.docs}")
    assert not wrong, "\n".join(wrong)
