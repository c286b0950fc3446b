"""The YAML a reader copies from the docs (every ```yaml block of docs/*.md and README.md) and from examples/,
sorted by what it is and loaded by what reads it.

A block is a leakprobe config unless its first line names another tool's file of examples/ (`# prometheus.yml`);
that one must set only keys the example sets (whose own tool checks it, tests/test_examples.py).  A leakprobe block
without `targets:` is a fragment: it is loaded as `--config block.yaml --target URL` loads it, nothing else added.
Loading is the real loader's (prober/config/schema.py: the file read as untrusted YAML, `LEAKPROBE_*` and flags
over it, the schema), then the daemon's own check of its job names (prober/daemon/schedule.py)."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

from prober.checks import REGISTRY
from prober.config.schema import ProberConfig, assemble_config, load_config
from prober.daemon.schedule import Timetable

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
FRAGMENT_TARGET = "http://engine.example:8000/v1"  # what `--target` gives a fragment
# A fence, indented as deep as the list item it sits in; the block ends at a fence as deep.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```ya?ml[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_NAMED = re.compile(r"^#\s*(?P<name>[\w.-]+\.ya?ml)\b")


@dataclass(frozen=True)
class Block:
    where: str  # page:line, or the example's path
    text: str

    @property
    def other_tool(self) -> Path | None:
        """The example of another tool's file this block is a copy of, where its first line names one."""
        named = _NAMED.match(self.text)
        example = EXAMPLES / named["name"] if named else None
        return example if example is not None and example.is_file() and not is_leakprobe(example) else None


def docs_blocks() -> list[Block]:
    """Every YAML block of the docs and the front page, dedented (a block inside a list item is indented)."""
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    return [Block(f"{page.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}", textwrap.dedent(m["body"]))
            for page in pages for text in [page.read_text(encoding="utf-8")] for m in _FENCE.finditer(text)]


def example_files() -> list[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.suffix in (".yaml", ".yml"))


def is_leakprobe(path: Path) -> bool:
    """A file of examples/ that the prober reads: it names targets."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return isinstance(data, dict) and "targets" in data


def load_leakprobe(text: str, folder: Path) -> ProberConfig:
    """A config or a fragment, as a reader who saved it would load it (no LEAKPROBE_* variables); raises
    ConfigError as the commands do."""
    path = folder / "block.yaml"
    path.write_text(text, encoding="utf-8")
    fragment = "targets" not in load_config(path)
    config = assemble_config(path, target=FRAGMENT_TARGET if fragment else None, environ={})
    Timetable(config.daemon, REGISTRY)
    return config


def foreign_keys(block: Block, example: Path) -> set[str]:
    """Top-level keys the block sets that its tool's example does not."""
    ours, theirs = yaml.safe_load(block.text), yaml.safe_load(example.read_text(encoding="utf-8"))
    assert isinstance(ours, dict) and isinstance(theirs, dict), block.where
    return set(ours) - set(theirs)
