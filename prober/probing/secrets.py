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
    Two tenants with one key are one identity to the engine: an audit of them would prove nothing."""
    secrets = {tenant.name: tenant.credential.load() for tenant in config.tenants}
    owners: dict[Secret, str] = {}
    for name, secret in secrets.items():
        if secret is None:
            continue
        if secret in owners:
            raise CredentialError(f"tenants {owners[secret]} and {name} have the same key: the engine cannot tell "
                                  "them apart, so nothing could cross between them; give each its own key")
        owners[secret] = name
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
