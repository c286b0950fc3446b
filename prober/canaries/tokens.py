"""Canary tokens: short, high-entropy, self-attributing strings.

Format (39 characters, Crockford base32, which has no I, L, O or U)::

    LPK-TTTTPPPP-RRRRRRRR-RRRRRRRR-MMMMMMMM

    TTTT     tenant tag, 20 bits = HMAC(key, "tenant" | name)  -- who planted it
    PPPP     probe tag,  20 bits = HMAC(key, "probe" | id)     -- which probe carried it
    R x 16   80 random bits                                     -- what makes it unguessable
                                                                   (a derived body's: HMAC(key, T | P))
    M x 8    40-bit MAC = HMAC(key, "token" | T | P | R)        -- a random look-alike verifies
                                                                   with probability 2**-40

The 32-character body is what is matched: its compact form (see compact.py) survives re-casing,
spaces and line breaks inside, dropped hyphens and look-alike characters.  Anyone holding the
deployment key can verify a body seen anywhere and read the tenant off it by recomputing the tags of
the tenants it knows -- no ledger needed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
PREFIX = "LPK"
BODY_LEN = 32
_RANDOM_CHARS = 16

COMPACT_PREFIX = "1PK"  # the prefix compacted (L is an alias of 1); a body follows it


def _b32(value: int, chars: int) -> str:
    out = []
    for _ in range(chars):
        value, digit = divmod(value, 32)
        out.append(ALPHABET[digit])
    return "".join(reversed(out))


def _tag(key: bytes, label: bytes, value: str, chars: int) -> str:
    digest = hmac.new(key, label + b"\x00" + value.encode(), hashlib.sha256).digest()
    return _b32(int.from_bytes(digest[:8], "big") >> (64 - 5 * chars), chars)


def tenant_tag(key: bytes, tenant: str) -> str:
    return _tag(key, b"tenant", tenant, 4)


def probe_tag(key: bytes, probe_id: str) -> str:
    return _tag(key, b"probe", probe_id, 4)


def _mac(key: bytes, unsigned: str) -> str:
    return _tag(key, b"token", unsigned, 8)


def mint_body(key: bytes, tenant: str, probe_id: str) -> str:
    """A fresh 32-character body (80 random bits from the OS CSPRNG)."""
    random_part = _b32(secrets.randbits(5 * _RANDOM_CHARS), _RANDOM_CHARS)
    unsigned = tenant_tag(key, tenant) + probe_tag(key, probe_id) + random_part
    return unsigned + _mac(key, unsigned)


def derived_body(key: bytes, tenant: str, probe_id: str) -> str:
    """A body whose 80 random bits are HMAC(key, tenant, probe) instead: the same every time under one key, so it can
    be built into something made once (a canary adapter's weights) and still verify and name its tenant like any
    other; unguessable without the key."""
    digest = hmac.new(key, b"derived\x00" + tenant.encode() + b"\x00" + probe_id.encode(), hashlib.sha256).digest()
    unsigned = (tenant_tag(key, tenant) + probe_tag(key, probe_id)
                + _b32(int.from_bytes(digest[:10], "big"), _RANDOM_CHARS))
    return unsigned + _mac(key, unsigned)


def lookalike() -> str:
    """A token of a canary's exact shape with random tags and MAC: it costs what a canary costs in any
    tokenizer and verifies as nothing (a 2**-40 chance).  For measuring prompt lengths, never for planting."""
    return display(_b32(secrets.randbits(5 * BODY_LEN), BODY_LEN))


def display(body: str) -> str:
    """The form that goes into prompts: prefix and hyphens help tokenizers and people."""
    return f"{PREFIX}-{body[:8]}-{body[8:16]}-{body[16:24]}-{body[24:]}"


@dataclass(frozen=True)
class VerifiedToken:
    body: str
    tenant_tag: str
    probe_tag: str
    tenant: str | None  # None when the tag matches no tenant this deployment knows


def verify(key: bytes, body: str, tenants: Iterable[str] = ()) -> VerifiedToken | None:
    """Check a compact body's MAC; attribute it to a known tenant by its tag."""
    if len(body) != BODY_LEN or any(ch not in ALPHABET for ch in body):
        return None
    if not hmac.compare_digest(_mac(key, body[:24]), body[24:]):
        return None
    tag = body[:4]
    owner = next((t for t in tenants if tenant_tag(key, t) == tag), None)
    return VerifiedToken(body=body, tenant_tag=tag, probe_tag=body[4:8], tenant=owner)
