"""The documentation site: it builds strictly, every alert's runbook link lands on an anchor of the built site,
the generated configuration reference lists every key of the schemas, the generated layout table every package
(each says in its docstring what it is for), the README is the short front page whose links resolve, and every
config the docs show loads as written (tests/support/yamlblocks.py).

The site is built once per module into a temporary folder, with mkdocs itself (`--strict`: a broken link or
anchor, or a config key without a description, fails the build)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from prober.cli import app
from prober.config.schema import ProberConfig
from prober.testbed.config import EngineConfig
from tests.support.testbed import SMALL, StartTestbed
from tests.support.tools import need_module
from tests.support.yamlblocks import Block, docs_blocks, foreign_keys, load_leakprobe

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "dashboards" / "prometheus" / "leakprobe-rules.yml"
PROBER = ROOT / "prober"


class _Page(HTMLParser):
    """Every element id of a page, and the text of each <code> under each <h2> (by the h2's id)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.h2_ids: list[str] = []
        self.code: dict[str, list[str]] = {}
        self._section = ""
        self._in_code = 0
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element_id = dict(attrs).get("id")
        if element_id:
            self.ids.add(element_id)
        if tag == "h2" and element_id:
            self._section = element_id
            self.h2_ids.append(element_id)
        if tag == "code":
            self._in_code += 1
            self._text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "code" and self._in_code:
            self._in_code -= 1
            self.code.setdefault(self._section, []).append("".join(self._text))

    def handle_data(self, data: str) -> None:
        if self._in_code:
            self._text.append(data)


def parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_module("mkdocs", "mkdocs")
    need_module("material", "mkdocs-material")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, printed on every build
    # A guard against a hung build, not a speed target: the build takes about 5 s on two busy cores.
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, env=env, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def site_url() -> str:
    url = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_url"]
    assert isinstance(url, str) and url.endswith("/")
    return url


def built_page(site: Path, page_path: str) -> Path:
    """The HTML file a site path serves (directory URLs: `runbook/` is `runbook/index.html`)."""
    return site / page_path / "index.html" if page_path.endswith("/") or not page_path else site / page_path


def test_site_builds_strictly_and_offline(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    sources = set(re.findall(r"[\w-]+\.md", str(nav)))
    assert sources == {p.name for p in (ROOT / "docs").glob("*.md")}, "every page in the nav, and only those"
    for source in sources:
        assert built_page(site, "" if source == "index.md" else source.removesuffix(".md") + "/").is_file(), source
    assert not list(site.rglob("*.py")), "the build-time hooks are code, not pages (exclude_docs)"
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, page


def test_every_runbook_url_resolves_to_an_anchor_of_the_site(site: Path) -> None:
    base = site_url()
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert rules
    linked: set[str] = set()
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(base), f"{rule['alert']}: {url} is not on the site ({base})"
        page_path, _, anchor = url.removeprefix(base).partition("#")
        page = built_page(site, page_path)
        assert page.is_file(), f"{rule['alert']}: no page {page_path!r} in the built site"
        assert anchor == rule["alert"].lower(), url
        assert anchor in parse(page).ids, f"{rule['alert']}: no anchor #{anchor} on {page_path}"
        linked.add(anchor)
    runbook = parse(built_page(site, "runbook/"))
    sections = {h2 for h2 in runbook.h2_ids if h2.startswith("leakprobe")}
    assert sections == linked, "one runbook section per alert, and no section for an alert that does not exist"


def schema_keys(model: type[BaseModel], path: str = "") -> Iterator[str]:
    """Every key a YAML file may set, dotted, `[]` after a list of mappings (as the reference writes them)."""
    for name, field in model.model_fields.items():
        key = f"{path}.{field.alias or name}" if path else field.alias or name
        yield key
        for inner in _models_in(field.annotation):
            yield from schema_keys(inner, key + ("[]" if get_origin(field.annotation) is list else ""))


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models_in(arg)


@pytest.mark.parametrize(("model", "section"), [(ProberConfig, "prober-config"), (EngineConfig, "engine-config")])
def test_configuration_reference_lists_every_key(site: Path, model: type[BaseModel], section: str) -> None:
    page = parse(built_page(site, "configuration/"))
    listed = set(page.code.get(section, []))
    keys = list(schema_keys(model))
    assert len(keys) > 10
    missing = [key for key in keys if key not in listed]
    assert not missing, f"keys of {model.__name__} missing from the configuration reference: {missing}"


def packages() -> list[Path]:
    """Every package under prober/, at any depth."""
    return sorted(init.parent for init in PROBER.rglob("__init__.py"))


@pytest.mark.unit
def test_every_package_and_top_level_module_says_what_it_is_for() -> None:
    """The layout table (docs/development.md, docs/hooks/layout.py) is their docstrings' first paragraphs."""
    sources = [p / "__init__.py" for p in packages()] + [p for p in PROBER.glob("*.py") if not p.name.startswith("__")]
    silent = [str(p.relative_to(ROOT)) for p in sources
              if not (ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "").strip()]
    assert len(sources) > 20
    assert not silent, f"no docstring saying what it is for (the layout table is rendered from them): {silent}"


def test_the_layout_table_lists_every_package(site: Path) -> None:
    listed = set(parse(built_page(site, "development/")).code.get("layout", []))
    expected = {p.relative_to(ROOT).as_posix() + "/" for p in packages()}
    assert expected | {"tests/support/", "canaries/", "Dockerfile", ".ci/run"} <= listed, listed
    assert "<!-- layout -->" not in built_page(site, "development/").read_text(encoding="utf-8")


def test_readme_is_the_short_front_page_and_its_links_resolve(site: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    assert re.search(r"^make demo +# ", readme, re.M) and re.search(r"^make test +# ", readme, re.M)
    links = re.findall(r"\]\((docs/[^)#\s]*)(?:#([^)\s]+))?\)", readme)
    assert len(links) > 10
    for target, anchor in links:
        source = ROOT / target
        assert source.exists(), target
        if anchor:
            name = source.name.removesuffix(".md")
            page = built_page(site, "" if name == "index" else name + "/")
            assert anchor in parse(page).ids, f"README links {target}#{anchor}, which the built page lacks"


@pytest.mark.unit
def test_the_docs_show_yaml_blocks_of_every_kind() -> None:
    """The rule that sorts them sees the configs the pages are known to hold, and another tool's file."""
    blocks = docs_blocks()
    pages = {b.where.split(":")[0] for b in blocks}
    assert {"docs/daemon.md", "docs/auditing.md", "docs/drill.md", "docs/targets.md"} <= pages, pages
    assert len([b for b in blocks if b.other_tool is None]) >= 6
    assert [b.other_tool.name for b in blocks if b.other_tool] == ["prometheus.yml"]


@pytest.mark.unit
@pytest.mark.parametrize("block", docs_blocks(), ids=lambda b: b.where)
def test_every_yaml_block_of_the_docs_loads_as_written(block: Block, tmp_path: Path) -> None:
    """A config or fragment through the real loader (a reader copies them: one refused is a lie in the docs); another
    tool's file sets only keys of its example, which that tool checks."""
    if block.other_tool is not None:
        assert not foreign_keys(block, block.other_tool), block.where
        return
    config = load_leakprobe(block.text, tmp_path)
    assert config.targets, block.where


@pytest.mark.slow
def test_readme_quickstart_runs_as_written(testbed: StartTestbed, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The front page's five-minute commands, against the reference engine's incident (scaled down) in place of
    a real endpoint: preflight flags the capacity inversion, the dry run sends nothing, the audit catches it, and
    so does the deploy gate."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Five minutes.*?```sh\n(.*?)```", readme, re.S)
    assert block, "README: the quickstart's sh block"
    commands = [shlex.split(line, comments=True)[1:] for line in block.group(1).splitlines()
                if line.startswith("leakprobe ")]
    assert [c[0] for c in commands] == ["preflight", "audit", "audit", "gate"]
    server = testbed("incident", **SMALL)
    monkeypatch.chdir(tmp_path)  # the audit's ledger and report land where it runs
    keys = {"KEY_A": "testbed-key-a", "KEY_B": "testbed-key-b"}
    results = [CliRunner().invoke(app, [server.url + "/v1" if a == "$URL" else a for a in c], env=keys)
               for c in commands]
    preflight, dry_run, audit, gate = results
    assert preflight.exit_code == 1 and "capacity_inversion" in preflight.output, preflight.output
    assert dry_run.exit_code == 0 and "DRY RUN" in dry_run.output, dry_run.output
    assert audit.exit_code == 1, audit.output
    report = (tmp_path / "audit.html").read_text()
    assert "cross_tenant_echo" in report
    assert gate.exit_code == 1 and "of a ceiling of 12,288" in gate.output, gate.output
