"""Parametrisation of the transport contract suite: every test taking ``transport`` runs once
per implementation (one whose module does not import yet is skipped, not failed), and every
async test taking ``backend`` once on asyncio and once on trio."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc
import pytest

from transports import transport_names

T = TypeVar("T")


def _param(name: str) -> Any:
    try:
        importlib.import_module(f"transports.{name}")
    except ImportError as e:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"transports.{name}: {e}"))
    return pytest.param(name)


TRANSPORTS = [_param(name) for name in transport_names()]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """A transport short name: a private default address for the binding side."""
    return request.param


def run(coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
    """Run an async test body in a fresh loop, bounded so a hang fails instead of blocking."""
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


BACKENDS = ["asyncio", "uvloop", "trio"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The event loop an async contract test runs on: the asyncio drivers on asyncio and uvloop,
    the anyio drivers on trio."""
    return request.param


def run_on(backend: str, body: Callable[[], Awaitable[T]], timeout: float = 120.0) -> T:
    """``await body()`` under ``anyio.run`` on ``backend`` (an anyio backend name, or uvloop),
    bounded so a hang fails."""
    async def bounded() -> T:
        if backend == "uvloop":
            assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        with anyio.fail_after(timeout):
            return await body()
    if backend == "uvloop":
        return anyio.run(bounded, backend="asyncio", backend_options={"use_uvloop": True})
    return anyio.run(bounded, backend=backend)


class Later(Generic[T]):
    """The outcome of an awaitable started in a task group (a backend-neutral
    ``asyncio.ensure_future``): ``await later.get()`` returns its result or raises its error."""

    def __init__(self, tg: anyio.abc.TaskGroup, fn: Callable[[], Awaitable[T]]) -> None:
        self._done = anyio.Event()
        self._result: T | None = None
        self._error: BaseException | None = None
        tg.start_soon(self._run, fn)

    async def _run(self, fn: Callable[[], Awaitable[T]]) -> None:
        try:
            self._result = await fn()
        except Exception as e:
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    async def get(self) -> T:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]
