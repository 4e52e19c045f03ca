"""asyncio shm endpoints. Waits go through the running loop (``add_reader`` on the eventfd,
the peer connection and the close eventfd, kept registered from the first wait until close:
see ``aio_driver``), so a waiting endpoint costs the loop nothing. Cancelling a ``recv`` loses
no message: nothing is consumed until it is returned.

The loop holds an endpoint's driver, never the endpoint, and a dropped endpoint's finalizer
unregisters its fds before it closes the core (which closes them: their numbers get reused)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Generic, TypeVar

from transports._deadline import check_timeout
from transports.base import AsyncReader, AsyncWriter, Buffer, Endpoint, Message
from transports.shm import options
from transports.shm import plans as P
from transports.shm import rendezvous as R
from transports.shm.aio_driver import AsyncDriver
from transports.shm.core import Core
from transports.shm.reader_core import ReaderCore
from transports.shm.writer_core import WriterCore

_C = TypeVar("_C", bound=Core)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _retired(endpoint: object, core: Core) -> tuple[AsyncDriver, weakref.finalize[[Core], object]]:
    """The endpoint's driver, and its close: at close() or when the endpoint is collected."""
    driver = AsyncDriver()
    return driver, weakref.finalize(endpoint, driver.retire, core)


class _Endpoint(Endpoint, Generic[_C]):
    def __init__(self, core: _C) -> None:
        self._core = core
        self._driver, self._close = _retired(self, core)

    @property
    def address(self) -> str:
        return self._core.url

    def close(self) -> None:
        self._close()


class ShmAsyncWriter(_Endpoint[WriterCore], AsyncWriter):

    async def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
                   timeout: float | None = None) -> None:
        core = self._core
        core.ops += 1
        try:
            if (steps := core.send_op(header, buffers, timeout)) is not None:
                await self._driver.run(steps)
        finally:
            core.after_op()


class ShmAsyncReader(_Endpoint[ReaderCore], AsyncReader):
    """``recv`` returns views into the shared ring, valid until the next ``recv``."""

    async def recv(self, timeout: float | None = None) -> Message:
        core = self._core
        if timeout is not None:
            check_timeout(timeout)
        core.ops += 1
        try:
            if core.fast:
                msg = core.ring.next_message()  # type: ignore[union-attr]  # fast: attached
                if msg is not None:
                    return msg
            deadline = _deadline(timeout)
            core.check_usable()
            msg = core.recv_now()
            if msg is not None:
                return msg
            return await self._driver.run(core.recv_steps(deadline, timeout))
        finally:
            core.after_op()


async def _connected(opening: tuple[_C, bool]) -> _C:
    core, connect = opening
    if connect:
        try:
            core.adopt(await R.connect_async(core.name, core.connect_timeout))
        except BaseException:
            core.close()
            raise
    return core


async def open_async_writer(address: str | None, *, bind: bool = True,
                            capacity: int = options.DEFAULT_CAPACITY,
                            connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                            ) -> ShmAsyncWriter:
    return ShmAsyncWriter(await _connected(P.writer(address, bind, capacity, connect_timeout)))


async def open_async_reader(address: str | None, *, bind: bool = False,
                            capacity: int = options.DEFAULT_CAPACITY,
                            connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                            ) -> ShmAsyncReader:
    return ShmAsyncReader(await _connected(P.reader(address, bind, capacity, connect_timeout)))


async def open_async_broadcast_writer(address: str | None, num_readers: int, *,
                                      capacity: int = options.DEFAULT_CAPACITY,
                                      connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                                      ) -> ShmAsyncWriter:
    return ShmAsyncWriter(await _connected(P.broadcast_writer(address, num_readers, capacity,
                                                              connect_timeout)))


async def open_async_broadcast_reader(address: str | None, rank: int, *,
                                      connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                                      ) -> ShmAsyncReader:
    return ShmAsyncReader(await _connected(P.broadcast_reader(address, rank, connect_timeout)))
