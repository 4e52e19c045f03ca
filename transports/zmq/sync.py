"""Blocking zmq endpoints: a thin driver of ``core``'s operations. They wait in ``zmq.Poller``
on the data socket, the monitor socket and a wake-up fd, so ``close()`` from another thread
interrupts any wait at once."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Generator, Sequence
from typing import TypeVar

import zmq

from transports._buffers import message_views
from transports._checks import check_args, check_num_readers, check_rank
from transports._deadline import Deadline, check_timeout
from transports._wakeup import Wakeup
from transports.base import Buffer, Endpoint, Message, SyncReader, SyncWriter
from transports.errors import ChannelClosedError
from transports.zmq import channel as C
from transports.zmq.address import parse
from transports.zmq.core import Wait, ZmqCore

T = TypeVar("T")

TRACKER_POLL = 0.05  # seconds between close checks while zmq still reads a caller's buffer


class _Base(Endpoint):
    _writer = False

    def __init__(self, connect_timeout: float, kind: int, address: str | None, *, bind: bool,
                 hwm: int, num_readers: int | None = None, rank: int | None = None) -> None:
        addr = parse(address, binding=bind)
        self._ch = ch = C.Channel(self, kind, addr, bind=bind, hwm=hwm, num_readers=num_readers,
                                  rank=rank)
        self._core = ZmqCore(ch, connect_timeout)
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._wake = Wakeup()
        self._closing = False
        self._closed = False
        weakref.finalize(self, ch.close, 0)  # dropped without close(): no linger, no leak

    @property
    def address(self) -> str:
        return self._ch.url

    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise ChannelClosedError(f"endpoint {self.address} is closed")

    def _run(self, gen: Generator[Wait, None, T]) -> T:
        """Drive one core operation: wait in ``zmq.Poller`` whenever it yields."""
        core = self._core
        try:
            w = next(gen)
            while True:
                if not w.settle or core.settled(w.settle):
                    self._poll(w.event, w.deadline)
                w = next(gen)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _poll(self, sock_event: int, deadline: Deadline) -> None:
        poller = zmq.Poller()
        if sock_event:
            poller.register(self._ch.sock, sock_event)
        if self._ch.mon is not None:
            poller.register(self._ch.mon, zmq.POLLIN)
        poller.register(self._wake.fd, zmq.POLLIN)
        poller.poll(deadline.remaining_ms())
        if self._closing:
            raise ChannelClosedError(f"endpoint {self.address} was closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closing = True
        self._wake.signal()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ch = self._ch
            live = ch.ready and ch.gone is None
            self._ch.close(C.LINGER_MS if self._writer and live else 0)


class ZmqSyncWriter(_Base, SyncWriter):
    _writer = True

    def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
             timeout: float | None = None) -> None:
        if (timeout is None and not buffers and type(header) is bytes
                and len(header) < C.COPY_BELOW and self._ch.kind == C.PUSH):
            # The common message (an engine's step outputs, a worker's result): as little
            # Python as possible, see Channel.send_small; full or not ready: the general path.
            with self._lock:
                if self._closing or self._closed:
                    self._check_open()
                if self._ch.send_small(header):
                    return
        deadline = Deadline(timeout)
        head, bufs = message_views(header, buffers)
        frames = [head, *bufs]
        with self._lock:
            self._check_open()
            ch = self._ch
            # Ready and room: the common case sends without making a generator.
            trackers = ch.send_step(frames) if ch.ready else None
            if trackers is None:
                trackers = self._run(self._core.send(frames, deadline))
            # zmq reads writable caller buffers later; return once it is done with them.
            for tracker in trackers:
                while not tracker.done:
                    try:
                        tracker.wait(TRACKER_POLL)
                    except zmq.NotDone:
                        if self._closing:
                            raise ChannelClosedError(
                                f"endpoint {self.address} was closed") from None


class ZmqSyncReader(_Base, SyncReader):
    def recv(self, timeout: float | None = None) -> Message:
        deadline = Deadline(timeout)
        with self._lock:
            self._check_open()
            msg = self._ch.try_recv()
            if msg is not None:
                return msg
            return self._run(self._core.recv(deadline, timeout))


def _connect(endpoint: _Base) -> None:
    """A connecting endpoint is returned only once the zmq handshake with the binder is done."""
    try:
        endpoint._run(endpoint._core.ensure_ready(Deadline(endpoint._connect_timeout),
                                                  connecting=True))
    except BaseException:
        endpoint.close()
        raise


def open_writer(address: str | None, *, bind: bool, capacity: int,
                connect_timeout: float) -> ZmqSyncWriter:
    check_args(capacity, connect_timeout)
    w = ZmqSyncWriter(connect_timeout, C.PUSH, address, bind=bind, hwm=C.hwm_for(capacity))
    if not bind:
        _connect(w)
    return w


def open_reader(address: str | None, *, bind: bool, capacity: int,
                connect_timeout: float) -> ZmqSyncReader:
    check_args(capacity, connect_timeout)
    r = ZmqSyncReader(connect_timeout, C.PULL, address, bind=bind, hwm=C.hwm_for(capacity))
    if not bind:
        _connect(r)
    return r


def open_broadcast_writer(address: str | None, num_readers: int, *, capacity: int,
                          connect_timeout: float) -> ZmqSyncWriter:
    check_args(capacity, connect_timeout)
    check_num_readers(num_readers)
    return ZmqSyncWriter(connect_timeout, C.XPUB, address, bind=True,
                         hwm=C.hwm_for(capacity), num_readers=num_readers)


def open_broadcast_reader(address: str | None, rank: int, *,
                          connect_timeout: float) -> ZmqSyncReader:
    check_timeout(connect_timeout, "connect_timeout")
    check_rank(rank)
    r = ZmqSyncReader(connect_timeout, C.SUB, address, bind=False,
                      hwm=C.hwm_for(C.DEFAULT_READER_CAPACITY), rank=rank)
    _connect(r)
    return r
