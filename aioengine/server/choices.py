"""Run the ``n`` choices of one HTTP request as ``n`` client generations and merge their
outputs into one ordered stream of ``(index, output)`` events.

Each generation is driven start to finish by its own task (a client generator must stay in the
task that started it). Choice 0 starts alone and the others only after it produced its first
output: a request the client rejects (bad prompt, too long) is refused before anything else
reaches the engine, and the later choices find the prompt already in the prefix cache.

``abort()`` (a shutting-down server) cancels every choice, which aborts it in the engine; each
then ends with an ``ABORTED`` event instead of its final output.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

StartChoice = Callable[[int], AsyncIterator[Any]]

_DONE = object()
ABORTED = object()
"""The event that ends a choice cut short by ``ChoiceRunner.abort()``."""


class ChoiceRunner:
    def __init__(self, start: StartChoice, n: int) -> None:
        self._start = start
        self._n = n
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._first: tuple[int, Any] | None = None
        self._aborted = False

    async def start(self) -> None:
        """Start choice 0 and wait for its first output; raises what the client raised
        (``ValueError`` for a rejected request, ``EngineDeadError``)."""
        self._spawn(0)
        index, item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        self._first = (index, item)
        for i in range(1, self._n):
            if self._aborted:  # never started: it ends as aborted too
                self._queue.put_nowait((i, ABORTED))
            else:
                self._spawn(i)

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        """Every output of every choice in arrival order; raises the first failure."""
        if self._first is None:
            raise RuntimeError("ChoiceRunner.events() before start()")
        live = self._n
        index, item = self._first
        while True:
            if item is _DONE or item is ABORTED:
                if item is ABORTED:
                    yield index, item
                live -= 1
                if live == 0:
                    return
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
            index, item = await self._queue.get()

    def abort(self) -> None:
        """End every choice now: each aborts in the engine and yields ``ABORTED``."""
        self._aborted = True
        for task in self._tasks:
            task.cancel()

    async def aclose(self) -> None:
        """Cancel what still runs: cancelling a generation aborts its request in the engine."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _spawn(self, index: int) -> None:
        task = asyncio.create_task(self._pump(index), name=f"choice-{index}")

        def ended(t: asyncio.Task[None]) -> None:
            # A done callback, not an except clause: a task cancelled before its first step
            # never runs its body, yet its choice must still end.
            if t.cancelled():
                self._queue.put_nowait((index, ABORTED))

        task.add_done_callback(ended)
        self._tasks.append(task)

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
