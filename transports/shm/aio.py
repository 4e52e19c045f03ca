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

from transports._deadline import check_timeout
from transports.base import AsyncReader, AsyncWriter, Buffer, Message
from transports.shm import options
from transports.shm import rendezvous as R
from transports.shm.address import parse_name
from transports.shm.aio_driver import AsyncDriver
from transports.shm.core import Core
from transports.shm.reader_core import ReaderCore
from transports.shm.writer_core import WriterCore


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _retired(endpoint: object, core: Core) -> tuple[AsyncDriver, weakref.finalize[[Core], object]]:
    """The endpoint's driver, and its close: at close() or when the endpoint is collected."""
    driver = AsyncDriver()
    return driver, weakref.finalize(endpoint, driver.retire, core)


class ShmAsyncWriter(AsyncWriter):
    def __init__(self, core: WriterCore) -> None:
        self._core = core
        self._driver, self._close = _retired(self, core)

    @property
    def address(self) -> str:
        return self._core.url

    async def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
                   timeout: float | None = None) -> None:
        core = self._core
        if timeout is not None:
            check_timeout(timeout)
        core.ops += 1
        try:
            if core.fast:
                core.check_peers()
                if core.ring.put_now(header, buffers):
                    return
            deadline = _deadline(timeout)
            core.check_usable()
            core.stage(header, buffers)
            if not core.send_now():
                await self._driver.run(core.send_steps(deadline, timeout))
        finally:
            core.after_op()

    def close(self) -> None:
        self._close()


class ShmAsyncReader(AsyncReader):
    """``recv`` returns views into the shared ring, valid until the next ``recv``."""

    def __init__(self, core: ReaderCore) -> None:
        self._core = core
        self._driver, self._close = _retired(self, core)

    @property
    def address(self) -> str:
        return self._core.url

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

    def close(self) -> None:
        self._close()


async def open_async_writer(address: str | None, *, bind: bool = True,
                            capacity: int = options.DEFAULT_CAPACITY,
                            connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                            ) -> ShmAsyncWriter:
    name, bind = parse_name(address), options.check_bind(bind)
    cap, wait = options.capacity(capacity), options.check_connect_timeout(connect_timeout)
    core = WriterCore(name, cap, 1, wait, bind)
    if not bind:
        try:
            core.adopt(await R.connect_async(name, wait))
        except BaseException:
            core.close()
            raise
    return ShmAsyncWriter(core)


async def open_async_reader(address: str | None, *, bind: bool = False,
                            capacity: int = options.DEFAULT_CAPACITY,
                            connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                            ) -> ShmAsyncReader:
    name, bind = parse_name(address), options.check_bind(bind)
    options.capacity(capacity)
    return ShmAsyncReader(await _reader_core(
        name, 0, options.check_connect_timeout(connect_timeout), bind))


async def open_async_broadcast_writer(address: str | None, num_readers: int, *,
                                      capacity: int = options.DEFAULT_CAPACITY,
                                      connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                                      ) -> ShmAsyncWriter:
    name, n = parse_name(address), options.num_readers(num_readers)
    cap, wait = options.capacity(capacity), options.check_connect_timeout(connect_timeout)
    return ShmAsyncWriter(WriterCore(name, cap, n, wait, bind=True))


async def open_async_broadcast_reader(address: str | None, rank: int, *,
                                      connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                                      ) -> ShmAsyncReader:
    if address is None:
        raise ValueError("a broadcast reader needs the writer's address (shm://NAME)")
    name, rank = parse_name(address), options.check_rank(rank)
    return ShmAsyncReader(await _reader_core(
        name, rank, options.check_connect_timeout(connect_timeout), bind=False))


async def _reader_core(name: str, rank: int, wait: float, bind: bool) -> ReaderCore:
    core = ReaderCore(name, rank, wait, bind)
    if not bind:
        try:
            core.adopt(await R.connect_async(name, wait))
        except BaseException:
            core.close()
            raise
    return core
