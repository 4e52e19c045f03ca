"""The client's loop objects under trio (see ``backends``). Imported only by a client started
from a trio task.

Background tasks are trio *system* tasks (``spawn_system_task``): they need no nursery from the
embedding program, the run cancels them when its main task returns (as ``asyncio.run`` cancels
what is left), and each runs in a cancel scope of its own that ``shutdown()`` cancels. A system
task that raised would crash the run, so the body's errors are logged here instead.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import trio

from aioengine.client.backend_types import CallFuture, TaskHandle

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TrioWaker:
    """An event that can be cleared (``trio.Event`` cannot): clearing a set one swaps in a
    fresh event. Only the stream's own consumer clears and waits."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = trio.Event()

    async def wait(self) -> object:
        await self._event.wait()
        return True


class TrioFuture:
    """A utility call's result: set once, awaited by the one caller."""

    __slots__ = ("_done", "_error", "_result")

    def __init__(self) -> None:
        self._done = trio.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def set_result(self, result: Any, /) -> None:
        if self.done():
            raise RuntimeError("this call's result was already set")
        self._result = result
        self._done.set()

    def set_exception(self, exception: BaseException, /) -> None:
        if self.done():
            raise RuntimeError("this call's result was already set")
        self._error = exception
        self._done.set()

    async def result(self) -> Any:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


class TrioTask:
    """A system task in a cancel scope of its own; ``done`` is set when it has ended."""

    __slots__ = ("_callbacks", "done", "name", "scope")

    def __init__(self, fn: Callable[..., Coroutine[Any, Any, None]], args: tuple[Any, ...],
                 name: str) -> None:
        self.name = name
        self.scope = trio.CancelScope()  # cancelling it before the task starts works too
        self.done = trio.Event()
        self._callbacks: list[Callable[[Any], object]] = []
        trio.lowlevel.spawn_system_task(self._run, fn, args, name=name)

    async def _run(self, fn: Callable[..., Coroutine[Any, Any, None]],
                   args: tuple[Any, ...]) -> None:
        try:
            with self.scope:
                await fn(*args)
        except Exception:
            logger.exception("the client's task %s failed", self.name)
        finally:
            self.done.set()
            for cb in self._callbacks:
                cb(self)

    def cancel(self) -> None:
        self.scope.cancel()

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        if self.done.is_set():
            fn(self)
        else:
            self._callbacks.append(fn)


class TrioBackend:
    """Bound to the trio run that started the client (its ``TrioToken``)."""

    name = "trio"
    lock = trio.Lock

    def __init__(self) -> None:
        self.token = trio.lowlevel.current_trio_token()

    def event(self) -> TrioWaker:
        return TrioWaker()

    def future(self) -> TrioFuture:
        return TrioFuture()

    async def wait_future(self, fut: CallFuture, timeout: float) -> Any:
        assert isinstance(fut, TrioFuture)
        try:
            with trio.fail_after(timeout):
                return await fut.result()
        except trio.TooSlowError:
            raise TimeoutError(f"no answer within {timeout} s") from None

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any,
              name: str) -> TrioTask:
        return TrioTask(fn, args, name)

    async def cancel_and_wait(self, tasks: list[TaskHandle]) -> None:
        for t in tasks:
            t.cancel()
        for t in tasks:
            assert isinstance(t, TrioTask)
            await t.done.wait()

    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> None:
        try:
            self.token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass  # the run ended; nothing is left to notify

    def is_current(self) -> bool:
        try:
            return trio.lowlevel.current_trio_token() is self.token
        except RuntimeError:  # not in a trio run (asyncio, or no loop)
            return False

    def is_closed(self) -> bool:
        try:
            self.token.run_sync_soon(_nothing)
        except trio.RunFinishedError:
            return True
        return False

    async def to_thread(self, fn: Callable[..., T], *args: Any) -> T:
        # Abandoned on cancellation, as asyncio.to_thread's awaiter is: the thread finishes
        # on its own (a supervisor's start or join is bounded by its own timeouts).
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)

    async def gather(self, *aws: Awaitable[Any], return_exceptions: bool = False
                     ) -> list[Any]:
        """``asyncio.gather``'s results in order; without ``return_exceptions`` the first
        error cancels the others and is raised."""
        results: list[Any] = [None] * len(aws)

        async def one(i: int, aw: Awaitable[Any]) -> None:
            try:
                results[i] = await aw
            except Exception as e:
                if not return_exceptions:
                    raise
                results[i] = e

        try:
            async with trio.open_nursery() as nursery:
                for i, aw in enumerate(aws):
                    nursery.start_soon(one, i, aw)
        except BaseException as exc:  # trio raises a group: the first error, as asyncio would
            first = _first_leaf(exc)
            if first is exc:
                raise
            raise first from None
        return results

    async def checkpoint(self) -> None:
        await trio.sleep(0)

    def shielded(self) -> contextlib.AbstractContextManager[Any]:
        return trio.CancelScope(shield=True)

    def __repr__(self) -> str:
        return f"<trio backend on {self.token!r}>"


async def wait_concurrent(fut: concurrent.futures.Future[T]) -> T:
    """The result of a ``concurrent.futures`` job, awaited under trio (cancelling the wait
    cancels the job if it has not started)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    fut.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        fut.cancel()
        raise
    return fut.result()


def _nothing() -> None:
    pass


def _first_leaf(exc: BaseException) -> BaseException:
    inner: list[BaseException] | None = getattr(exc, "exceptions", None)  # an exception group
    while inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return exc
