"""A blocking-portal call that an interrupt in the calling thread cancels on the loop too.

``BlockingPortal.call`` waits on a future; Ctrl-C's ``KeyboardInterrupt`` ends that wait in
the main thread but leaves the task running on the portal's loop, so its requests keep
running in the engine (and a stream's ``__anext__`` is still running when the iterator's
cleanup tries ``aclose``).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

T = TypeVar("T")


def call_interruptibly(portal: BlockingPortal, fn: Callable[..., Awaitable[T]],
                       *args: Any) -> T:
    """``await fn(*args)`` on the portal's loop. If this thread is interrupted while it waits
    (even while the task is being spawned), the task is cancelled and its cleanup (a stream's
    abort) has run before the interrupt propagates. A second interrupt stops that wait."""
    scopes: list[anyio.CancelScope] = []  # touched only on the loop's thread
    cancelled = threading.Event()
    done = threading.Event()

    async def run() -> T:
        try:
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                if cancelled.is_set():
                    scope.cancel()
                return await fn(*args)
            return None  # type: ignore[return-value]  # cancelled: the caller is raising
        finally:
            done.set()

    def cancel() -> None:
        for scope in scopes:
            scope.cancel()

    try:
        return portal.start_task_soon(run).result()
    except BaseException:
        if not done.is_set():  # interrupted here while the task may run there
            cancelled.set()
            # Spawned after ``run`` (if that was spawned at all), so it runs after run's first
            # step: either ``run`` registered its scope, or it will see ``cancelled``.
            portal.call(cancel)
            if scopes:
                done.wait()
        raise
