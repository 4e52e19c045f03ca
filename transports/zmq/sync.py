"""Blocking zmq endpoints. They wait in ``zmq.Poller`` on the data socket, the monitor socket
and a wake-up fd, so ``close()`` from another thread interrupts any wait at once."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import zmq

from transports._buffers import message_views
from transports._checks import check_args, check_num_readers, check_rank
from transports._deadline import Deadline, check_timeout
from transports._wakeup import Wakeup
from transports.base import Buffer, Endpoint, Message, SyncReader, SyncWriter
from transports.errors import ChannelClosedError
from transports.zmq import channel as C
from transports.zmq.address import parse

TRACKER_POLL = 0.05  # seconds between close checks while zmq still reads a caller's buffer


class _Base(Endpoint):
    _writer = False

    def __init__(self, connect_timeout: float, kind: int, address: str | None, *, bind: bool,
                 hwm: int, num_readers: int | None = None, rank: int | None = None) -> None:
        addr = parse(address, binding=bind)
        self._ch = ch = C.Channel(self, kind, addr, bind=bind, hwm=hwm, num_readers=num_readers,
                                  rank=rank)
        self._connect_timeout = connect_timeout
        self._connect_deadline: Deadline | None = None
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

    def _ensure_ready(self, deadline: Deadline, connecting: bool = False) -> None:
        ch = self._ch
        ch.process_events()
        if ch.error is not None:
            raise ch.error
        if ch.ready:
            return
        if self._connect_deadline is None:
            self._connect_deadline = Deadline(self._connect_timeout)
        wait = Deadline.earliest(deadline, self._connect_deadline)
        while True:
            ch.process_events()
            if ch.error is not None:
                raise ch.error
            if ch.ready:
                return
            if wait.expired():
                raise ready_timeout(ch, self._connect_deadline, self._connect_timeout, connecting)
            # XPUB learns of subscribers by reading the socket; the rest from the monitor.
            self._poll(zmq.POLLIN if ch.kind == C.XPUB else 0, wait)

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


def ready_timeout(ch: C.Channel, connect_deadline: Deadline, connect_timeout: float,
                  connecting: bool) -> TimeoutError:
    if connecting:
        return TimeoutError(f"could not connect to {ch.url} within {connect_timeout} s "
                            "(connect_timeout)")
    what = f"only {len(ch.ranks)} of {ch.num_readers} readers" if ch.kind == C.XPUB else "no peer"
    if connect_deadline.expired():
        return TimeoutError(f"{what} connected to {ch.url} within {connect_timeout} s "
                            "(connect_timeout)")
    return TimeoutError(f"timed out waiting for peers of {ch.url} ({what} connected so far)")


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
            if not ch.ready:  # once ready, send_step's own look at the events is enough
                self._ensure_ready(deadline)
            backoff = 0.001
            while True:
                trackers = ch.send_step(frames)
                if trackers is not None:
                    break
                if deadline.expired():
                    raise TimeoutError(f"channel {self.address} stayed full; nothing was sent")
                if ch.kind == C.XPUB:
                    # XPUB never reports POLLOUT honestly: back off until a slow reader drains.
                    self._poll(0, Deadline.earliest(deadline, Deadline(backoff)))
                    backoff = min(backoff * 2, 0.02)
                elif not ch.has(C.POLLOUT):
                    self._poll(zmq.POLLOUT, deadline)
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
            ch = self._ch
            msg = ch.try_recv()
            if msg is not None:
                return msg
            if not ch.ready:
                self._ensure_ready(deadline)
            while True:
                msg = ch.recv_step()
                if msg is not None:
                    return msg
                if deadline.expired():
                    raise TimeoutError(f"no message on {self.address} within {timeout} s")
                if ch.has(C.POLLIN) or ch.mon_has_events():
                    continue
                self._poll(zmq.POLLIN, deadline)


def _connect(endpoint: _Base) -> None:
    """A connecting endpoint is returned only once the zmq handshake with the binder is done."""
    try:
        endpoint._ensure_ready(Deadline(endpoint._connect_timeout), connecting=True)
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
