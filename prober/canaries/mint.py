"""Minting: every canary is written to the ledger (with its embedding) before anyone can send it."""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Sequence

from prober.canaries import tokens
from prober.canaries.adapters import adapter_canary
from prober.canaries.packs import load_pack
from prober.domain.types import Canary, CanaryKind
from prober.embeddings import Embedder
from prober.ledger import Ledger

DEFAULT_RETENTION_DAYS = 30.0


def new_id(prefix: str = "cn") -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


class Minter:
    def __init__(
        self,
        ledger: Ledger,
        key: bytes,
        embedder: Embedder | None = None,
        retention_days: float = DEFAULT_RETENTION_DAYS,
    ) -> None:
        self.ledger = ledger
        self.key = key
        self.embedder = embedder
        self.retention_seconds = retention_days * 86400

    def _stamp(self, retention_s: float | None = None) -> tuple[float, float]:
        now = time.time()
        return now, now + (self.retention_seconds if retention_s is None else retention_s)

    def tokens(self, tenant: str, count: int = 1, probe_id: str = "", retention_s: float | None = None) -> list[Canary]:
        """`retention_s` overrides the minter's retention (the daemon's sentinels keep theirs shorter)."""
        created, expires = self._stamp(retention_s)
        minted = [
            Canary(id=new_id(), tenant=tenant, kind=CanaryKind.TOKEN,
                   text=tokens.display(tokens.mint_body(self.key, tenant, probe_id)),
                   probe_id=probe_id, created_at=created, expires_at=expires)
            for _ in range(count)
        ]
        self.ledger.add_canaries(minted)
        return minted

    def adapter(self, tenant: str, adapter: str) -> Canary:
        """The canary a tenant's canary adapter was built to answer with, kept in the ledger (the same id every
        run, its retention extended) before any prompt asks for it."""
        canary = adapter_canary(self.key, tenant, adapter, self.retention_seconds)
        self.ledger.keep_canaries([canary])
        return canary

    def facts(self, tenant: str, count: int = 1, probe_id: str = "", language: str = "en",
              rng: random.Random | None = None, retention_s: float | None = None) -> list[Canary]:
        if self.embedder is None:
            raise ValueError("minting facts needs an embedder (their embeddings are stored with them)")
        pack = load_pack(language)
        drawn = [pack.mint(rng) for _ in range(count)]
        vectors = self.embedder.encode([f.text for f in drawn])
        created, expires = self._stamp(retention_s)
        minted = [
            Canary(id=new_id(), tenant=tenant, kind=CanaryKind.FACT, text=fact.text, probe_id=probe_id,
                   created_at=created, expires_at=expires, pack=language, values=fact.distinctive,
                   aliases=fact.aliases,
                   embedding=vector.tobytes(), embedding_model=self.embedder.name)
            for fact, vector in zip(drawn, vectors, strict=True)
        ]
        self.ledger.add_canaries(minted)
        return minted

    def mint(self, tenant: str, kind: CanaryKind, count: int, probe_id: str = "",
             language: str = "en") -> Sequence[Canary]:
        if kind is CanaryKind.TOKEN:
            return self.tokens(tenant, count, probe_id)
        return self.facts(tenant, count, probe_id, language)
