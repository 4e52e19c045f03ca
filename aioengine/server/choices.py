"""Run the ``n`` choices of one HTTP request as ``n`` client generations and merge their
outputs into one ordered stream of ``(index, output)`` events.

Each generation is driven start to finish by its own task (a client generator must stay in the
task that started it). Choice 0 starts alone and the others only after it produced its first
output: a request the client rejects (bad prompt, too long) is refused before anything else
reaches the engine, and the later choices find the prompt already in the prefix cache.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

StartChoice = Callable[[int], AsyncIterator[Any]]

_DONE = object()


class ChoiceRunner:
    def __init__(self, start: StartChoice, n: int) -> None:
        self._start = start
        self._n = n
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._first: tuple[int, Any] | None = None

    async def start(self) -> None:
        """Start choice 0 and wait for its first output; raises what the client raised
        (``ValueError`` for a rejected request, ``EngineDeadError``)."""
        self._spawn(0)
        index, item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        self._first = (index, item)
        for i in range(1, self._n):
            self._spawn(i)

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        """Every output of every choice in arrival order; raises the first failure."""
        if self._first is None:
            raise RuntimeError("ChoiceRunner.events() before start()")
        live = self._n
        index, item = self._first
        while True:
            if item is _DONE:
                live -= 1
                if live == 0:
                    return
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
            index, item = await self._queue.get()

    async def aclose(self) -> None:
        """Cancel what still runs: cancelling a generation aborts its request in the engine."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _spawn(self, index: int) -> None:
        self._tasks.append(asyncio.create_task(self._pump(index), name=f"choice-{index}"))

    async def _pump(self, index: int) -> None:
        put = self._queue.put_nowait
        try:
            agen = self._start(index)
            async with contextlib.aclosing(agen):  # type: ignore[type-var]
                async for output in agen:
                    put((index, output))
        except Exception as e:  # handed to the HTTP handler, which maps it to a status
            put((index, e))
        else:
            put((index, _DONE))
