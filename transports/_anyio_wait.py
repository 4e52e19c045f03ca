"""Waiting on fds through anyio, for the endpoint drivers used on an event loop other than
asyncio's (trio). The asyncio drivers keep their fds registered with the loop (the measured
path); these watch each fd for one wait only: a task per fd under a cancel scope that the
first fd to fire, or the deadline, cancels. Every fd a driver waits on stays open until the
wait has left (trio must unregister an fd before it is closed), so the drivers close their
sockets only once no wait is in flight (see ``Waiting``)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence

import anyio

from transports._deadline import Deadline
from transports._wakeup import Wakeup


async def wait_fds(readable: Sequence[int], deadline: Deadline,
                   writable: Sequence[int] = ()) -> None:
    """Until one of ``readable`` is readable, one of ``writable`` writable, or ``deadline``;
    returns in every case (the caller looks at what changed)."""
    left = deadline.remaining()
    with anyio.move_on_after(math.inf if left is None else left):
        async with anyio.create_task_group() as tg:
            scope = tg.cancel_scope
            for fd in readable:
                tg.start_soon(_watch, anyio.wait_readable, fd, scope)
            for fd in writable:
                tg.start_soon(_watch, anyio.wait_writable, fd, scope)


async def _watch(wait: Callable[[int], Awaitable[None]], fd: int,
                 scope: anyio.CancelScope) -> None:
    await wait(fd)
    scope.cancel()


class Waiting:
    """Counts the operations of one endpoint that may be waiting on its fds, and runs the
    endpoint's release (closing its sockets) when ``close()`` came while one was: at the
    moment the last one leaves, after its watches are gone."""

    __slots__ = ("_release", "closed", "ops")

    def __init__(self) -> None:
        self.ops = 0
        self.closed = False
        self._release: Callable[[], None] | None = None

    def close(self, release: Callable[[], None]) -> None:
        """Mark closed; release now, or when the last operation in flight leaves."""
        self.closed = True
        if self.ops:
            self._release = release
        else:
            release()

    def leave(self) -> None:
        self.ops -= 1
        if not self.ops and self._release is not None:
            release, self._release = self._release, None
            release()


def on_asyncio() -> bool:
    """True under a running asyncio loop (uvloop too): the asyncio drivers apply. False under
    trio (``asyncio.get_running_loop`` has no loop to give there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class AnyioClose:
    """``close()`` of an endpoint driven through anyio: wake a waiting operation (``_wake``),
    and ``_release`` once none is waiting (``_waiting``)."""

    _closed: bool
    _wake: Wakeup
    _waiting: Waiting

    def close(self) -> None:
        if self._closed:
            return
        self._before_close()
        self._closed = True
        self._wake.signal()
        self._waiting.close(self._release)

    def _before_close(self) -> None:
        """What may still finish first (a background flush's linger)."""

    def _release(self) -> None:
        raise NotImplementedError
