"""Blocking shm endpoints, for busy loops. A waiting reader spins briefly (adaptively), then
sleeps in poll(2) on its eventfd, the writer's connection (death) and its own close eventfd
(``close()`` from another thread)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Generic, TypeVar

from transports._deadline import check_timeout
from transports.base import Buffer, Endpoint, Message, SyncReader, SyncWriter
from transports.shm import options
from transports.shm import plans as P
from transports.shm import rendezvous as R
from transports.shm.core import Core
from transports.shm.reader_core import ReaderCore
from transports.shm.ring_reader import RingReader
from transports.shm.waiting import SyncDriver
from transports.shm.writer_core import WriterCore

_C = TypeVar("_C", bound=Core)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


class _Endpoint(Endpoint, Generic[_C]):
    def __init__(self, core: _C) -> None:
        self._core = core
        self._driver = SyncDriver()

    @property
    def address(self) -> str:
        return self._core.url

    def close(self) -> None:
        self._core.close()


class ShmSyncWriter(_Endpoint[WriterCore], SyncWriter):
    """Point-to-point or broadcast writer. Not for concurrent use from several threads
    (``close()`` excepted)."""

    def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
             timeout: float | None = None) -> None:
        core = self._core
        core.ops += 1
        try:
            if (steps := core.send_op(header, buffers, timeout)) is not None:
                self._driver.run(steps)
        finally:
            core.after_op()


class ShmSyncReader(_Endpoint[ReaderCore], SyncReader):
    """Point-to-point or broadcast reader. ``recv`` returns views into the shared ring, valid
    until the next ``recv`` (copy them to keep them). Not for concurrent use from several
    threads (``close()`` excepted)."""

    def recv(self, timeout: float | None = None) -> Message:
        core = self._core
        if timeout is not None:
            check_timeout(timeout)
        core.ops += 1
        try:
            spun = False
            if core.fast:
                ring: RingReader = core.ring  # type: ignore[assignment]  # fast: attached
                msg = ring.next_message()
                if msg is not None:
                    return msg
                deadline = _deadline(timeout)
                # Spin, then sleep, right here: a ping-pong never builds the generator of the
                # general path below. Work per wake-up matters on a busy machine: the scheduler
                # hands a woken task the core at once only while it runs briefly.
                spun = True
                if self._driver.spinner.spin(ring.has_data) or self._doze(timeout):
                    msg = ring.next_message()
                    if msg is not None:
                        return msg
            else:
                deadline = _deadline(timeout)
            core.check_usable()
            msg = core.recv_now()
            if msg is not None:
                return msg
            return self._driver.run(core.recv_steps(deadline, timeout), spun)
        finally:
            core.after_op()

    def _doze(self, timeout: float | None) -> bool:
        ms = -1 if timeout is None else math.ceil(timeout * 1000)
        start = time.monotonic_ns()
        if not self._core.doze(ms):
            return False
        self._driver.spinner.slept(time.monotonic_ns() - start)
        return True


def _connected(opening: tuple[_C, bool]) -> _C:
    core, connect = opening
    if connect:
        try:
            core.adopt(R.connect(core.name, core.connect_timeout))
        except BaseException:
            core.close()
            raise
    return core


def open_writer(address: str | None, *, bind: bool = True,
                capacity: int = options.DEFAULT_CAPACITY,
                connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT) -> ShmSyncWriter:
    return ShmSyncWriter(_connected(P.writer(address, bind, capacity, connect_timeout)))


def open_reader(address: str | None, *, bind: bool = False,
                capacity: int = options.DEFAULT_CAPACITY,
                connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT) -> ShmSyncReader:
    return ShmSyncReader(_connected(P.reader(address, bind, capacity, connect_timeout)))


def open_broadcast_writer(address: str | None, num_readers: int, *,
                          capacity: int = options.DEFAULT_CAPACITY,
                          connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                          ) -> ShmSyncWriter:
    return ShmSyncWriter(_connected(P.broadcast_writer(address, num_readers, capacity,
                                                       connect_timeout)))


def open_broadcast_reader(address: str | None, rank: int, *,
                          connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                          ) -> ShmSyncReader:
    return ShmSyncReader(_connected(P.broadcast_reader(address, rank, connect_timeout)))
