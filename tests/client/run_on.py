"""Backend-neutral helpers for client tests that run on asyncio and trio alike (anyio)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from aioengine.client.backends import has_driver

T = TypeVar("T")

BACKENDS = ["asyncio", "trio"]
TRANSPORTS = ["shm", "zmq", "uds"]
# (transport, backend) pairs the client tests run on: every transport on asyncio, and every one
# whose async endpoints run on trio (transports.async_backends) on trio.
CLIENT_CASES = [(t, "asyncio") for t in TRANSPORTS] + [
    (t, "trio") for t in TRANSPORTS if has_driver(t, "trio")]
CASE_IDS = [t if b == "asyncio" else f"{t}-{b}" for t, b in CLIENT_CASES]


async def gather(*fns: Callable[[], Awaitable[T]]) -> list[T]:
    """``await fn()`` for each at once; results in order (the first error cancels the rest)."""
    results: list[Any] = [None] * len(fns)

    async def one(i: int) -> None:
        results[i] = await fns[i]()

    async with anyio.create_task_group() as tg:
        for i in range(len(fns)):
            tg.start_soon(one, i)
    return results
