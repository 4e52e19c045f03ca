"""Notice HTTP clients that went away while their request waits on the engine.

aiohttp does not cancel a handler when its client disconnects (and an app mounted as a sub-app
cannot change that setting of its host), and a write only fails once there is something to
write. One sweep task per app checks the watched requests' connections a few times a second and
cancels the handler of any that closed; the cancellation aborts its engine requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from aiohttp import web


class Watch:
    """What a handler holds while watched: ``gone`` tells a disconnect from other cancels."""

    __slots__ = ("gone", "request", "task")

    def __init__(self, request: web.BaseRequest, task: asyncio.Task[object]) -> None:
        self.request = request
        self.task = task
        self.gone = False


class DisconnectWatcher:
    def __init__(self, interval: float = 0.2) -> None:
        self._interval = interval
        self._watches: set[Watch] = set()
        self._sweeper: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watch(self, request: web.BaseRequest) -> Iterator[Watch]:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("DisconnectWatcher.watch() outside a task")
        w = Watch(request, task)
        self._watches.add(w)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="http-disconnect-watcher")
        try:
            yield w
        finally:
            self._watches.discard(w)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    async def _sweep(self) -> None:
        while self._watches:
            await asyncio.sleep(self._interval)
            for w in list(self._watches):
                transport = w.request.transport
                if not w.gone and (transport is None or transport.is_closing()):
                    w.gone = True
                    w.task.cancel(msg="HTTP client disconnected")
