"""The client's loop objects under asyncio (and uvloop): asyncio's own, bound to the loop that
started the client, so the per-token path (``asyncio.Event`` set by the output task, cleared
and awaited by the stream) goes through no layer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

from aioengine.client.backend_types import CallFuture, TaskHandle

T = TypeVar("T")


class AsyncioBackend:
    """Today's asyncio objects, bound to the loop that started the client."""

    name = "asyncio"
    event = asyncio.Event
    lock = asyncio.Lock

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def future(self) -> asyncio.Future[Any]:
        return self.loop.create_future()

    async def wait_future(self, fut: CallFuture, timeout: float) -> Any:
        return await asyncio.wait_for(fut, timeout)  # type: ignore[arg-type]  # ours

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any,
              name: str) -> asyncio.Task[None]:
        return self.loop.create_task(fn(*args), name=name)

    async def cancel_and_wait(self, tasks: list[TaskHandle]) -> None:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*cast("list[asyncio.Task[None]]", tasks), return_exceptions=True)

    async def to_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def gather(self, *aws: Awaitable[Any], return_exceptions: bool = False
                     ) -> list[Any]:
        return await asyncio.gather(*aws, return_exceptions=return_exceptions)

    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> None:
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the loop closed in between; nothing is left to notify

    def is_current(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:  # not on an asyncio loop (trio)
            return False

    def is_closed(self) -> bool:
        return self.loop.is_closed()

    async def checkpoint(self) -> None:
        await asyncio.sleep(0)

    def shielded(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # asyncio's cancellation is raised once

    def __repr__(self) -> str:
        return f"<asyncio backend on {self.loop!r}>"
