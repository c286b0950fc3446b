"""Per-tenant API keys: read from an environment variable or a secret file, never from a config file,
and never printable — `repr`, `str` and f-strings of a `Secret` show a mask."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from prober.domain.errors import CredentialError
from prober.text.scrub import MIN_SECRET


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The only way to the value; call it where the header is built and nowhere else."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class CredentialSource:
    """Where a key lives: `env` names a variable, `file` a path (Kubernetes secret mounts)."""

    env: str | None = None
    file: Path | None = None

    def describe(self) -> str:
        return f"${self.env}" if self.env else f"file {self.file}" if self.file else "no credential"

    def load(self) -> Secret | None:
        if self.env:
            value = os.environ.get(self.env)
            if value is None:
                raise CredentialError(f"environment variable {self.env} is not set")
        elif self.file:
            try:
                value = self.file.read_text(encoding="utf-8")
            except OSError as exc:
                raise CredentialError(f"cannot read secret file {self.file}: {exc.strerror}") from None
            except ValueError as exc:  # a NUL in the path, or not UTF-8 text
                raise CredentialError(f"cannot read secret file {self.file!r}: {exc}") from None
        else:
            return None
        value = value.strip()
        if not value:
            raise CredentialError(f"{self.describe()} is empty")
        if len(value) < MIN_SECRET:
            raise CredentialError(f"{self.describe()} holds fewer than {MIN_SECRET} characters: too short to keep "
                                  "out of reports")
        if any(ch in value for ch in "\r\n\x00"):
            raise CredentialError(f"{self.describe()} holds more than one line")
        return Secret(value)
