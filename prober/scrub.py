"""One scrubber for every secret leakprobe knows: tenant API keys, the canary key, database passwords.

A target may be hostile or merely careless: a debug gateway echoes the request's `Authorization` header
into its error bodies or answers.  Whatever the target sends is scrubbed where it enters (the transport),
and every exit (log lines, reports, the ledger, `/status`) scrubs again, so no secret reaches a file or a
screen.  A secret is *replaced* by a label naming whose it was, never masked to its shape, and its common
encodings (JSON-escaped, URL-quoted, base64) are replaced too.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

MIN_SECRET = 4  # shorter "secrets" would scrub ordinary text; the config refuses them


def _variants(value: str) -> set[str]:
    raw = value.encode()
    return {v for v in (value, json.dumps(value)[1:-1], quote(value, safe=""),
                        base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="))
            if len(v) >= MIN_SECRET}


class Scrubber:
    """`secrets` maps a label ("key of tenant-a") to a secret value."""

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        by_variant: dict[str, str] = {}
        for label, value in (secrets or {}).items():
            for variant in _variants(value):
                by_variant.setdefault(variant, f"[redacted {label}]")
        self._labels = by_variant
        pattern = "|".join(re.escape(v) for v in sorted(by_variant, key=len, reverse=True))
        self._text = re.compile(pattern) if pattern else None
        self._bytes = re.compile(pattern.encode()) if pattern else None

    def __bool__(self) -> bool:
        return self._text is not None

    def text(self, value: str) -> str:
        if self._text is None or not value:
            return value
        return self._text.sub(lambda m: self._labels[m.group(0)], value)

    def bytes(self, value: bytes | bytearray) -> bytes | bytearray:
        if self._bytes is None or not value:
            return value
        return self._bytes.sub(lambda m: self._labels[m.group(0).decode()].encode(), value)

    def value(self, obj: Any) -> Any:
        """Strings inside JSON-like data (finding details, /status)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.text(str(k)): self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj


class ScrubbingFilter(logging.Filter):
    """Applied to a handler: every record it emits is scrubbed, whichever library logged it."""

    def __init__(self, scrubber: Scrubber) -> None:
        super().__init__()
        self.scrubber = scrubber

    def filter(self, record: logging.LogRecord) -> bool:
        if self.scrubber:
            message = record.getMessage()
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.msg, record.args = self.scrubber.text(message), None
            if record.exc_text:
                record.exc_text = self.scrubber.text(record.exc_text)
        return True


def scrub_logs(scrubber: Scrubber) -> None:
    """Scrub every log line from now on (on every handler of the root logger)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(ScrubbingFilter(scrubber))
