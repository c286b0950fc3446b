"""A paged KV pool: fixed-size pages, a free list that hands recently freed pages out first, and
pages that are *not* zeroed when freed -- the allocator shape of real paged-attention engines, and the
reason an engine that attends over pages it did not write reads an earlier request's prompt.

Each "KV entry" is stored as the int32 token id that produced it, so a million-token pool costs 4 MB.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prober.testbed.config import PageReuse
from prober.testbed.tokenizer import TokenIds


class PoolExhausted(Exception):
    """Not enough free pages arrived before the wait deadline."""


@dataclass(frozen=True)
class PoolUsage:
    pages_total: int
    pages_used: int
    page_size: int

    @property
    def tokens_total(self) -> int:
        return self.pages_total * self.page_size

    @property
    def tokens_used(self) -> int:
        return self.pages_used * self.page_size


class PagePool:
    """Thread-safe page allocator over one contiguous int32 buffer.

    Allocation is all-or-nothing (a request never holds part of what it asked for while waiting), so
    requests that each need one pool cannot deadlock one another.
    """

    def __init__(self, name: str, num_tokens: int, page_size: int,
                 reuse: PageReuse = PageReuse.IN_ORDER) -> None:
        if page_size < 1 or num_tokens < page_size:
            raise ValueError(f"pool {name}: needs page_size >= 1 and at least one page")
        self.name = name
        self.page_size = page_size
        self.reuse = reuse
        self.num_pages = num_tokens // page_size
        self._data = np.zeros(self.num_pages * page_size, dtype=np.int32)
        # The end of the list is its front: freed pages are appended in reverse so that the next
        # allocation takes them back in their original order (most recently freed first).
        self._free: list[int] = list(range(self.num_pages - 1, -1, -1))
        self._owner: dict[int, str] = {}
        self._cond = threading.Condition()

    # -- allocation ---------------------------------------------------------------------------
    def pages_for(self, num_tokens: int) -> int:
        return max(1, -(-num_tokens // self.page_size))

    def allocate(self, num_pages: int, owner: str, timeout: float) -> list[int]:
        if num_pages > self.num_pages:
            raise PoolExhausted(f"{self.name}: {num_pages} pages requested, pool has {self.num_pages}")
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._free) < num_pages:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._cond.wait(remaining):
                    if len(self._free) >= num_pages:
                        break
                    raise PoolExhausted(
                        f"{self.name}: {num_pages} pages not free within {timeout:.1f}s "
                        f"({len(self._free)} of {self.num_pages} free)"
                    )
            pages = self._free[-num_pages:][::-1]
            del self._free[-num_pages:]
            for page in pages:
                if page in self._owner:
                    raise AssertionError(f"{self.name}: page {page} handed out twice")
                self._owner[page] = owner
            return pages

    def free(self, pages: Sequence[int], owner: str) -> None:
        """Return pages to the front of the free list.  Contents stay as they are (not zeroed)."""
        with self._cond:
            for page in pages:
                if self._owner.get(page) != owner:
                    raise AssertionError(f"{self.name}: {owner} frees page {page} it does not own")
                del self._owner[page]
            self._free.extend(reversed(pages) if self.reuse is PageReuse.IN_ORDER else pages)
            self._cond.notify_all()

    # -- contents -----------------------------------------------------------------------------
    def write(self, pages: Sequence[int], tokens: TokenIds, start: int = 0) -> None:
        """Write tokens at logical positions start.. of the page table."""
        size = self.page_size
        pos = start
        end = start + len(tokens)
        while pos < end:
            page_index, offset = divmod(pos, size)
            take = min(size - offset, end - pos)
            base = pages[page_index] * size + offset
            self._data[base : base + take] = tokens[pos - start : pos - start + take]
            pos += take

    def read(self, pages: Sequence[int], num_tokens: int) -> TokenIds:
        """The first num_tokens positions of a page table, whatever those pages hold."""
        if not pages or num_tokens <= 0:
            return np.zeros(0, dtype=np.int32)
        index = np.asarray(pages, dtype=np.int64)
        view = self._data.reshape(self.num_pages, self.page_size)[index].reshape(-1)
        return view[:num_tokens].copy()

    # -- bookkeeping --------------------------------------------------------------------------
    def usage(self) -> PoolUsage:
        with self._cond:
            return PoolUsage(self.num_pages, len(self._owner), self.page_size)

    def check_invariants(self) -> None:
        """No page owned twice or both owned and free; free + used = pool."""
        with self._cond:
            free = set(self._free)
            if len(free) != len(self._free):
                raise AssertionError(f"{self.name}: a page is on the free list twice")
            if free & self._owner.keys():
                raise AssertionError(f"{self.name}: a page is both free and owned")
            if len(free) + len(self._owner) != self.num_pages:
                raise AssertionError(f"{self.name}: free + used != pool")
