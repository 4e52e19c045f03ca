"""Backend-neutral helpers for client tests that run on asyncio and trio alike (anyio)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

# (transport, backend) pairs the client tests run on: every transport on asyncio, and the ones
# with a trio driver on trio.
CLIENT_CASES = [("shm", "asyncio"), ("zmq", "asyncio"), ("uds", "asyncio"), ("shm", "trio")]
CASE_IDS = ["shm", "zmq", "uds", "shm-trio"]
BACKENDS = ["asyncio", "trio"]


async def gather(*fns: Callable[[], Awaitable[T]]) -> list[T]:
    """``await fn()`` for each at once; results in order (the first error cancels the rest)."""
    results: list[Any] = [None] * len(fns)

    async def one(i: int) -> None:
        results[i] = await fns[i]()

    async with anyio.create_task_group() as tg:
        for i in range(len(fns)):
            tg.start_soon(one, i)
    return results
