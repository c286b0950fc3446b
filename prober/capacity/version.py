"""Which release of its engine a target runs, as the engine says it: what the bug table's versions are compared with.

vLLM answers `GET /version` (`{"version": "0.32.0"}`), SGLang and TGI put a `version` in their server info, and
llama.cpp its `build_info` in `/props` (`b11434-1a2b3c4`: the build number is the release).  Where none of those
answers (a gateway forwards only the API), an engine's `server` header may still name it (llama.cpp's says
`llama.cpp`), with its version where the header gives one (`name/1.2.3`).  A llama.cpp built
from a source archive without git says `b0-unknown`: a version that names no release, so nothing may be concluded
from it (every check runs, as for an engine that says nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypedDict

from packaging.version import InvalidVersion, Version

from prober.targets.api import Engine

_LLAMACPP_BUILD = re.compile(r"^b(\d+)(?:-|$)")


class EngineVersionDoc(TypedDict):
    text: str
    source: str
    release: str | None


@dataclass(frozen=True)
class EngineVersion:
    text: str  # as the engine said it (bounded: a hostile target may say anything)
    source: str  # where, e.g. "vllm GET /version"

    def release(self, engine: Engine | None) -> Version | None:
        """The release this names for `engine`'s numbering, or None where it names none (a build without its
        number, a string that is no version, a testbed)."""
        text = self.text.strip()
        if engine is Engine.LLAMACPP:
            build = _LLAMACPP_BUILD.match(text)
            return Version(build.group(1)) if build and int(build.group(1)) > 0 else None
        try:
            return Version(text.removeprefix("v"))
        except InvalidVersion:
            return None

    def to_json(self, engine: Engine | None) -> EngineVersionDoc:
        release = self.release(engine)
        return {"text": self.text, "source": self.source, "release": str(release) if release else None}


# Engines by the product name their `server` header gives ("llama.cpp"; a "name/version" product where one says it).
_SERVERS = {"llama.cpp": Engine.LLAMACPP, "vllm": Engine.VLLM, "sglang": Engine.SGLANG,
            "text-generation-inference": Engine.TGI}
_PRODUCT = re.compile(r"([!#$%&'*+.^_`|~\w-]+)(?:/([!#$%&'*+.^_`|~\w-]+))?")


def served_by(header: str | None) -> tuple[Engine, EngineVersion | None] | None:
    """The engine a `server` header names, and its version where the product gives one; None where it names no
    engine (a gateway's or a web server's own: `uvicorn`, `envoy`, `nginx/1.25`)."""
    for match in _PRODUCT.finditer((header or "")[:256]):
        engine = _SERVERS.get(match.group(1).lower())
        if engine is not None:
            return engine, said(match.group(2), "server header")
    return None


def said(value: object, source: str) -> EngineVersion | None:
    """A version from what an endpoint answered: a short string, else nothing."""
    if not isinstance(value, str) or not value.strip():
        return None
    return EngineVersion(value.strip()[:64], source)
