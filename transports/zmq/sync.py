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
from transports._deadline import Deadline
from transports._wakeup import BlockingClose, Wakeup
from transports.base import Buffer, Endpoint, Message, SyncReader, SyncWriter
from transports.errors import ChannelClosedError
from transports.zmq import channel as C
from transports.zmq import core as K
from transports.zmq.core import Wait

T = TypeVar("T")
_B = TypeVar("_B", bound="_Base")

TRACKER_POLL = 0.05  # seconds between close checks while zmq still reads a caller's buffer


class _Base(BlockingClose, Endpoint):
    _writer = False

    def __init__(self, plan: K.Plan, connect_timeout: float) -> None:
        self._core = K.ZmqCore.open(self, plan, connect_timeout)
        self._ch = ch = self._core.ch
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

    def _release(self) -> None:
        ch = self._ch
        ch.close(ch.closing_linger(self._writer))


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


def _open(cls: type[_B], plan: K.Plan, connect_timeout: float) -> _B:
    """A connecting endpoint is returned only once the zmq handshake with the binder is done."""
    endpoint = cls(plan, connect_timeout)
    if plan.connect:
        try:
            endpoint._run(endpoint._core.connecting())
        except BaseException:
            endpoint.close()
            raise
    return endpoint


def open_writer(address: str | None, *, bind: bool, capacity: int,
                connect_timeout: float) -> ZmqSyncWriter:
    plan = K.plan_writer(address, bind, capacity, connect_timeout)
    return _open(ZmqSyncWriter, plan, connect_timeout)


def open_reader(address: str | None, *, bind: bool, capacity: int,
                connect_timeout: float) -> ZmqSyncReader:
    plan = K.plan_reader(address, bind, capacity, connect_timeout)
    return _open(ZmqSyncReader, plan, connect_timeout)


def open_broadcast_writer(address: str | None, num_readers: int, *, capacity: int,
                          connect_timeout: float) -> ZmqSyncWriter:
    plan = K.plan_broadcast_writer(address, num_readers, capacity, connect_timeout)
    return _open(ZmqSyncWriter, plan, connect_timeout)


def open_broadcast_reader(address: str | None, rank: int, *,
                          connect_timeout: float) -> ZmqSyncReader:
    plan = K.plan_broadcast_reader(address, rank, connect_timeout)
    return _open(ZmqSyncReader, plan, connect_timeout)
