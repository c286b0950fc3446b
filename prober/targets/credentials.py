"""Per-tenant API keys: read from an environment variable or a secret file, never from a config file,
and never printable — `repr`, `str` and f-strings of a `Secret` show a mask.  Where tenants are end users behind
one key, a key carries its end user: the pair is the caller."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from prober.domain.errors import CredentialError
from prober.text.scrub import MIN_SECRET


class Secret:
    """`end_user`: the end-user identity sent beside the key (no secret: a gateway bills, limits and may scope its
    cache by it); two tenants that share a key are told apart by it, so it is part of the caller's identity."""

    __slots__ = ("_value", "end_user")

    def __init__(self, value: str, end_user: str | None = None) -> None:
        self._value = value
        self.end_user = end_user

    def reveal(self) -> str:
        """The only way to the value; call it where the header is built and nowhere else."""
        return self._value

    @property
    def key(self) -> Secret:
        """The key alone, without its end user."""
        return Secret(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self.end_user is None else f"Secret('***', end_user={self.end_user!r})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and (other._value, other.end_user) == (self._value, self.end_user)

    def __hash__(self) -> int:
        return hash((self._value, self.end_user))


@dataclass(frozen=True)
class CredentialSource:
    """Where a key lives: `env` names a variable, `file` a path (Kubernetes secret mounts); `end_user`: the end user
    the key is sent for, where the tenant is one."""

    env: str | None = None
    file: Path | None = None
    end_user: str | None = None

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
        return Secret(value, self.end_user)
