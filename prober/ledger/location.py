"""Where the ledger lives, parsed once from what the operator wrote, the same way for every command.

A file path, `sqlite:` URL or `postgresql://` URL; anything else that looks like a URL is refused, because
taking `postgresql:/…` or `mysql://…` as a file name would silently keep canaries in a local file that no
other replica reads (and put a password into a path).  `sqlite:///var/lib/x.sqlite` is the file
`/var/lib/x.sqlite`, as a `file:` URL reads; SQLAlchemy's `sqlite:////abs` means the same file, and
`sqlite:relative.sqlite` a file under the working directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from prober.domain.errors import LedgerError
from prober.ledger.credentials import POSTGRES, masked

FORMS = "a file path, sqlite:///path or postgresql://user@host:port/db"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


@dataclass(frozen=True)
class LedgerLocation:
    given: str  # as written (may hold a password: print `masked`, never this)
    path: Path | None = None  # a SQLite file
    url: str | None = None  # a PostgreSQL server

    @property
    def masked(self) -> str:
        return masked(self.url) if self.url else str(self.path)

    def __str__(self) -> str:
        return self.masked

    @classmethod
    def parse(cls, text: str | Path | LedgerLocation) -> LedgerLocation:
        """Raises LedgerError, naming the forms accepted, for anything that is not one of them."""
        if isinstance(text, LedgerLocation):
            return text
        given = str(text).strip()
        if not given or "\x00" in given:
            raise LedgerError(f"ledger: expected {FORMS}")
        if given.startswith(POSTGRES):  # no host: libpq's local socket
            try:
                urlsplit(given).port  # noqa: B018 (parses the port: a bad one is refused here, not at connect)
            except ValueError as exc:
                raise LedgerError(f"ledger {masked(given)}: {exc}") from None
            return cls(given, url=given)
        if given.startswith("sqlite:"):
            rest = given.removeprefix("sqlite:")
            if rest.startswith("//"):
                rest = rest[2:]
                if not rest.startswith("/"):
                    raise LedgerError(f"ledger {given}: a sqlite URL names no host; write sqlite:///absolute/path "
                                      "or sqlite:relative/path")
                rest = "/" + rest.lstrip("/")
            if not rest:
                raise LedgerError(f"ledger {given}: no file named")
            return cls(given, path=Path(rest))
        scheme = _SCHEME.match(given)
        if scheme and ("://" in given or scheme.group(1).lower().startswith("postgres")):
            raise LedgerError(f"ledger {scheme.group(1)}:…: unsupported; give {FORMS}")
        return cls(given, path=Path(given))
