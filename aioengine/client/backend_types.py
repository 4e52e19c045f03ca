"""What the client needs from its event loop, as types: the backends (``asyncio_backend``,
``trio_backend``) provide it, ``backends.current_backend()`` picks one per client.

An event per stream that the output task sets and the consumer clears (``Waker``), a future per
utility call (``CallFuture``), a lock per channel, background tasks (the output task, the abort
flush: ``TaskHandle``), a hop from a monitor thread onto the loop, worker threads for blocking
work, and cleanup that a cancelled scope cannot cut short.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


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
