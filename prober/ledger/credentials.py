"""Where a shared ledger's password comes from, so that the server can be reached and every output scrubbed
of it: the URL, PGPASSWORD, or the file LEAKPROBE_LEDGER_PASSWORD_FILE names (a mounted secret)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

from prober.domain.errors import LedgerError

PASSWORD_FILE_ENV = "LEAKPROBE_LEDGER_PASSWORD_FILE"
POSTGRES = ("postgres://", "postgresql://")


def is_shared(url: str | Path) -> bool:
    """Whether several replicas can share the ledger at `url` (a database server, not a file)."""
    return str(url).startswith(POSTGRES)


def password_from_file(environ: Mapping[str, str] | None = None) -> str | None:
    path = (os.environ if environ is None else environ).get(PASSWORD_FILE_ENV)
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, ValueError) as exc:
        raise LedgerError(f"{PASSWORD_FILE_ENV}: cannot read {path!r}: {exc}") from None


def ledger_password(url: str | Path, environ: Mapping[str, str] | None = None) -> str | None:
    """The password a shared ledger at `url` is reached with (None for a file)."""
    if not is_shared(url):
        return None
    environ = os.environ if environ is None else environ
    try:
        given = urlsplit(str(url)).password
    except ValueError:
        given = None
    return unquote(given) if given else password_from_file(environ) or environ.get("PGPASSWORD") or None


def masked(url: str | Path) -> str:
    """The ledger's location as messages may show it: a URL's password replaced by ***."""
    text = str(url)
    if not is_shared(text):
        return text
    try:
        parts = urlsplit(text)
        if parts.password is None:
            return text
        host = parts.netloc.rpartition("@")[2]
        return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()
    except ValueError:
        return text.split("://", 1)[0] + "://***"  # unparseable: show nothing that could be the password
