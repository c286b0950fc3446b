"""Every secret a run holds: the tenants' keys (read before anything is sent) and the scrubber that keeps
all of them, and the canary key, out of every output."""

from __future__ import annotations

import os

from prober.canaries.keys import KEY_ENV
from prober.config.schema import ProberConfig
from prober.domain.errors import CredentialError, LedgerError
from prober.ledger.credentials import ledger_password
from prober.targets.credentials import Secret
from prober.text.scrub import Scrubber


def load_secrets(config: ProberConfig) -> dict[str, Secret | None]:
    """Every tenant's key, read now so a missing one fails before anything is sent (CredentialError).
    Two tenants with one key are one identity to the engine, and an audit of them would prove nothing, unless each
    is its own end user behind that key (`end_user`): then they are what a gateway tells apart by end user."""
    secrets = {tenant.name: tenant.credential.load() for tenant in config.tenants}
    owners: dict[Secret, dict[str | None, str]] = {}  # a key alone -> its tenants by end user
    for name, secret in secrets.items():
        if secret is None:
            continue
        behind = owners.setdefault(secret.key, {})
        if behind and (secret.end_user is None or None in behind or secret.end_user in behind):
            other = behind.get(secret.end_user) or next(iter(behind.values()))
            both = secret.end_user is not None and secret.end_user in behind
            how = f"and end user {secret.end_user!r}" if both else "without an end user for each"
            raise CredentialError(f"tenants {other} and {name} have the same key {how}: nothing tells them apart, "
                                  "so nothing could cross between them; give each its own key or its own end_user")
        behind[secret.end_user] = name
    return secrets


def scrubber_for(secrets: dict[str, Secret | None], environ: dict[str, str] | None = None,
                 ledger: str | None = None) -> Scrubber:
    """Scrubs the tenants' keys, the deployment's canary key and a shared ledger's password."""
    environ = dict(os.environ) if environ is None else environ
    known = {f"key of {name}": secret.reveal() for name, secret in secrets.items() if secret is not None}
    try:
        password = ledger_password(ledger, environ) if ledger else None
    except LedgerError as exc:  # its secret file is a credential like the tenants' keys
        raise CredentialError(str(exc)) from None
    for label, value in (("canary key", environ.get(KEY_ENV)), ("ledger password", password)):
        if value:
            known[label] = value
    return Scrubber(known)
