"""Two adjustments to glibc's allocator for long-running processes that work in threads and drop large
structures now and then (the reference engine's prompt buffers, the daemon's canary indexes).  Measured:
without them resident memory crept up burst after burst although nothing stayed referenced.  Where the C
library is not glibc, both do nothing."""

from __future__ import annotations

import ctypes
from functools import cache

M_ARENA_MAX = -8  # mallopt parameter
ARENAS = 2


@cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - present only in glibc
    except (OSError, AttributeError):
        return None
    return libc


def cap_arenas() -> None:
    """glibc gives each thread its own arena; memory freed in one stays fragmented there.  Two suffice."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, ARENAS)


def trim() -> None:
    """Hand memory that was freed (a replaced index) back to the system instead of keeping it."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
