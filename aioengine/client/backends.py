"""The event-loop objects the client uses, chosen once per client in ``start()``: asyncio's own
(today's objects on the hot path, unchanged), or trio's.

The client needs few things from its loop: an event per stream that the output task sets and the
consumer clears (``Waker``), a future per utility call (``CallFuture``), a lock per channel,
background tasks (the output task, the abort flush), a hop from a monitor thread onto the loop,
and worker threads for blocking work. ``current_backend()`` asks sniffio which library runs the
calling task (uvloop reports "asyncio"); asyncio gets ``AsyncioBackend``, which hands out the
very objects the client used before (``asyncio.Event``, ``loop.create_future``, ...), so no
per-token call goes through a layer. trio gets ``TrioBackend`` (``trio_backend``): trio is
imported only then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar, cast

import sniffio

T = TypeVar("T")

BACKENDS = ("asyncio", "trio")


class Waker(Protocol):
    """A stream's wake-up: set by the output task (or a death, an abort), cleared and waited on
    by the stream's consumer."""

    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> object: ...


class CallFuture(Protocol):
    """A utility call's result slot: resolved by the output task (or a death)."""

    def done(self) -> bool: ...
    def set_result(self, result: Any, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


class TaskHandle(Protocol):
    """A background task the client started and cancels at shutdown."""

    def cancel(self) -> object: ...
    def add_done_callback(self, fn: Callable[[Any], object], /) -> None: ...


class Backend(Protocol):
    name: str

    def event(self) -> Waker: ...
    def future(self) -> CallFuture: ...
    async def wait_future(self, fut: CallFuture, timeout: float) -> Any:
        """The future's result; ``TimeoutError`` after ``timeout`` seconds."""
    def lock(self) -> contextlib.AbstractAsyncContextManager[Any]: ...
    def spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any,
              name: str) -> TaskHandle: ...
    async def cancel_and_wait(self, tasks: list[TaskHandle]) -> None: ...
    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop from another thread; nothing once the loop is gone."""
    def is_current(self) -> bool:
        """True when called from a task of this backend's own loop (or run)."""
    def is_closed(self) -> bool:
        """True once the loop (or trio run) has ended."""
    async def to_thread(self, fn: Callable[..., T], *args: Any) -> T: ...
    async def gather(self, *aws: Awaitable[Any], return_exceptions: bool = False
                     ) -> list[Any]: ...
    async def checkpoint(self) -> None: ...
    def shielded(self) -> contextlib.AbstractContextManager[Any]:
        """Cleanup that must run to its end even in a cancelled scope (trio's cancellation
        is level-triggered: every await in a cancelled scope raises again)."""


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


TRIO_TRANSPORTS = frozenset({"shm"})
"""Transports whose async endpoints run under trio (shm: ``transports/shm/anyio_driver``).
When ``transports.factory`` offers ``async_backends(url)`` (the names of the event-loop
libraries a transport's async endpoints run on), it is asked instead."""


def check_transport(transport: str, backend: str) -> None:
    """``ValueError`` naming the transport when its async endpoints cannot run on ``backend``
    (today: zmq and uds under trio, until they have trio drivers)."""
    if backend == "asyncio":
        return
    from transports import factory
    ask = getattr(factory, "async_backends", None)
    kind = transport.partition("://")[0].partition("+")[0]
    supported = backend in ask(transport) if ask is not None else kind in TRIO_TRANSPORTS
    if not supported:
        raise ValueError(
            f"transport {transport!r} has no {backend} driver yet: under {backend} the client "
            f"needs transport='shm' (EngineConfig(transport='shm'), the default), or run it "
            f"under asyncio")


def current_backend() -> Backend:
    """The backend of the calling task's event loop: ``RuntimeError`` outside one, or on a
    library the client does not support."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        raise RuntimeError("the client must be started from a running event loop "
                           f"(one of {', '.join(BACKENDS)})") from None
    if library == "asyncio":
        return AsyncioBackend(asyncio.get_running_loop())
    if library == "trio":
        from aioengine.client.trio_backend import TrioBackend
        return TrioBackend()
    raise RuntimeError(f"the client runs under asyncio (or uvloop) or trio, not under "
                       f"{library!r}")
