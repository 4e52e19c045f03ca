"""Blocking shm endpoints, for busy loops. A waiting reader spins briefly (adaptively), then
sleeps in poll(2) on its eventfd, the writer's connection (death) and its own close eventfd
(``close()`` from another thread)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from transports._deadline import check_timeout
from transports.base import Buffer, Message, SyncReader, SyncWriter
from transports.shm import options
from transports.shm import rendezvous as R
from transports.shm.address import parse_name
from transports.shm.reader_core import ReaderCore
from transports.shm.ring_reader import RingReader
from transports.shm.waiting import SyncDriver
from transports.shm.writer_core import WriterCore


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


class ShmSyncWriter(SyncWriter):
    """Point-to-point or broadcast writer. Not for concurrent use from several threads
    (``close()`` excepted)."""

    def __init__(self, core: WriterCore) -> None:
        self._core = core
        self._driver = SyncDriver()

    @property
    def address(self) -> str:
        return self._core.url

    def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
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
                self._driver.run(core.send_steps(deadline, timeout))
        finally:
            core.after_op()

    def close(self) -> None:
        self._core.close()


class ShmSyncReader(SyncReader):
    """Point-to-point or broadcast reader. ``recv`` returns views into the shared ring, valid
    until the next ``recv`` (copy them to keep them). Not for concurrent use from several
    threads (``close()`` excepted)."""

    def __init__(self, core: ReaderCore) -> None:
        self._core = core
        self._driver = SyncDriver()

    @property
    def address(self) -> str:
        return self._core.url

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

    def close(self) -> None:
        self._core.close()


def open_writer(address: str | None, *, bind: bool = True,
                capacity: int = options.DEFAULT_CAPACITY,
                connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT) -> ShmSyncWriter:
    name, bind = parse_name(address), options.check_bind(bind)
    cap, wait = options.capacity(capacity), options.check_connect_timeout(connect_timeout)
    core = WriterCore(name, cap, 1, wait, bind)
    if not bind:
        try:
            core.adopt(R.connect(name, wait))
        except BaseException:
            core.close()
            raise
    return ShmSyncWriter(core)


def open_reader(address: str | None, *, bind: bool = False,
                capacity: int = options.DEFAULT_CAPACITY,
                connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT) -> ShmSyncReader:
    """``capacity`` is chosen by the writer (it creates the ring); it is validated here only."""
    name, bind = parse_name(address), options.check_bind(bind)
    options.capacity(capacity)
    return ShmSyncReader(_reader_core(name, 0, options.check_connect_timeout(connect_timeout),
                                      bind))


def open_broadcast_writer(address: str | None, num_readers: int, *,
                          capacity: int = options.DEFAULT_CAPACITY,
                          connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                          ) -> ShmSyncWriter:
    name, n = parse_name(address), options.num_readers(num_readers)
    cap, wait = options.capacity(capacity), options.check_connect_timeout(connect_timeout)
    return ShmSyncWriter(WriterCore(name, cap, n, wait, bind=True))


def open_broadcast_reader(address: str | None, rank: int, *,
                          connect_timeout: float = options.DEFAULT_CONNECT_TIMEOUT
                          ) -> ShmSyncReader:
    if address is None:
        raise ValueError("a broadcast reader needs the writer's address (shm://NAME)")
    name, rank = parse_name(address), options.check_rank(rank)
    return ShmSyncReader(_reader_core(name, rank, options.check_connect_timeout(connect_timeout),
                                      bind=False))


def _reader_core(name: str, rank: int, wait: float, bind: bool) -> ReaderCore:
    core = ReaderCore(name, rank, wait, bind)
    if not bind:
        try:
            core.adopt(R.connect(name, wait))
        except BaseException:
            core.close()
            raise
    return core
