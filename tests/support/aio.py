"""Running a coroutine from a synchronous test."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro
    return asyncio.run(main())
