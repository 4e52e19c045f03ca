"""Blocking uds endpoints (for busy loops), a thin driver of ``core``'s operations. Each waits in
poll(2) on its socket(s) plus a wake-up fd, so ``close()`` from another thread interrupts any
wait at once. A frame whose ``send`` gave up half-written is finished by a thread
(``ThreadFlusher``, also used by the trio driver)."""

from __future__ import annotations

import select
import threading
from collections.abc import Callable, Generator, Sequence
from typing import TypeVar

from transports._buffers import message_views
from transports._deadline import Deadline
from transports._wakeup import BlockingClose, Wakeup
from transports.base import Buffer, Endpoint, Message, SyncReader, SyncWriter
from transports.errors import ChannelClosedError, TransportError
from transports.uds import address as A
from transports.uds import core as K
from transports.uds import stream as S
from transports.uds.framing import PREFIX, frame_parts
from transports.uds.outbound import SEND_FLAGS, Outbound

T = TypeVar("T")

_IN, _OUT = select.POLLIN, select.POLLOUT
SMALL_FRAME = 64 * 1024  # a header up to this size goes out by _send_small (one copy of it)


def run_blocking(gen: Generator[K.Wait, None, T], wake: Wakeup,
                 closing: Callable[[], bool], url: str) -> T:
    """Drive one core operation: poll(2) on its fds and ``wake`` whenever it yields; a wake-up
    with ``closing()`` true raises ChannelClosedError."""
    try:
        w = next(gen)
        while True:
            poller = select.poll()
            ev = _OUT if w.writable else _IN
            for fd in w.fds:
                poller.register(fd, ev)
            poller.register(wake.fd, _IN)
            poller.poll(w.deadline.remaining_ms())
            if closing():
                raise ChannelClosedError(f"endpoint {url} was closed")
            w = next(gen)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class ThreadFlusher:
    """Finishes a half-written frame in a thread after its ``send`` gave up (a timeout with part
    of the frame on the wire: it must complete, or the stream breaks); the next send waits for
    it, and close() lets it finish for ``stream.LINGER`` seconds."""

    __slots__ = ("_closing", "_core", "_error", "_thread", "_wake")

    def __init__(self, core: K.UdsCore, wake: Wakeup, closing: Callable[[], bool]) -> None:
        self._core, self._wake, self._closing = core, wake, closing
        self._thread: threading.Thread | None = None
        self._error: TransportError | None = None

    @property
    def idle(self) -> bool:
        return self._thread is None

    def start(self, pending: S.Pending) -> None:
        for _, out in pending:
            out.detach()
        self._thread = threading.Thread(target=self._flush, args=(pending,), daemon=True,
                                        name="aiot-uds-flush")
        self._thread.start()

    def _flush(self, pending: S.Pending) -> None:
        core = self._core
        try:
            run_blocking(core.write(pending, Deadline(None), stash=False), self._wake,
                         self._closing, core.url)
        except ChannelClosedError:
            pass
        except TransportError as e:
            self._error = e

    def done(self) -> bool:
        """True once no flush runs (raising the error a finished one met)."""
        thread = self._thread
        if thread is None:
            return True
        if thread.is_alive():
            return False
        self._thread = None
        if self._error is not None:
            raise self._error
        return True

    def join(self, seconds: float | None) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(seconds)


class FlushOnClose:
    """The closing of a writer whose half-written frames a ``ThreadFlusher`` finishes: the
    flush gets ``stream.LINGER`` seconds, then (woken by the wake-up fd) it stops writing before
    the sockets close."""

    _thread_flusher: ThreadFlusher
    _core: K.UdsCore

    def _before_close(self) -> None:
        self._thread_flusher.join(S.LINGER)

    def _release(self) -> None:
        self._thread_flusher.join(None)
        self._core.close_sockets()


class _Base(BlockingClose, Endpoint):
    """Waiting and closing shared by the sync reader and writer."""

    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        self._core = K.UdsCore(addr, connect_timeout)
        self._peers = self._core.peers
        self._lock = threading.Lock()  # one operation at a time; close() waits for it
        self._wake = Wakeup()
        self._closing = False
        self._closed = False

    @property
    def address(self) -> str:
        return self._core.url

    def _is_closing(self) -> bool:
        return self._closing

    def _run(self, gen: Generator[K.Wait, None, T]) -> T:
        return run_blocking(gen, self._wake, self._is_closing, self._core.url)

    def _check_open(self) -> None:
        self._core.check_usable(self._closing or self._closed)

    def _release(self) -> None:
        self._core.close_sockets()


class UdsSyncWriter(FlushOnClose, _Base, SyncWriter):
    """Point-to-point (one peer) or broadcast (``num_readers`` peers) writer."""

    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        super().__init__(addr, connect_timeout)
        self._thread_flusher = ThreadFlusher(self._core, self._wake, self._is_closing)

    def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
             timeout: float | None = None) -> None:
        if not buffers and timeout is None and type(header) is bytes \
                and len(header) <= SMALL_FRAME and self._send_small(header):
            return
        deadline = Deadline(timeout)
        parts = frame_parts(*message_views(header, buffers))
        with self._lock:
            self._check_open()
            core = self._core
            if core.accepting:
                self._run(core.ensure_peers(deadline))
            if not self._thread_flusher.done():
                self._thread_flusher.join(deadline.remaining())
                if not self._thread_flusher.done():
                    raise S.full_error(self.address)
            outs = [(peer, Outbound(parts)) for peer in core.peers]
            pending = core.write_now(outs)  # most frames go out in this one pass
            if pending:
                self._write(outs, deadline, pending)

    def _send_small(self, header: bytes) -> bool:
        """The commonest send (one small frame to one connected reader, no timeout) in one
        non-blocking ``send``, skipping the general path's per-call set-up (~15 us of Python
        that, in an engine, holds the GIL its model needs). False when the general path must
        do it: more readers or none yet, a frame still going out in the background, a closed
        or broken endpoint, or a socket error (nothing was written then)."""
        with self._lock:
            core = self._core
            peers = core.peers
            if len(peers) != 1 or core.accepting or not self._thread_flusher.idle \
                    or self._closing or self._closed or core.broken is not None:
                return False
            frame = PREFIX.pack(len(header), 0) + header
            try:
                n = peers[0].sock.send(frame, SEND_FLAGS)
            except BlockingIOError:
                n = 0
            except OSError:
                return False
            if n < len(frame):  # the rest, as the general path would: wait, or finish later
                out = Outbound([memoryview(frame)[n:]])
                out.started = n > 0
                self._write([(peers[0], out)], Deadline(None))
            return True

    def _write(self, outs: S.Pending, deadline: Deadline,
               pending: S.Pending | None = None) -> None:
        rest = self._run(self._core.write(outs, deadline, stash=True, pending=pending))
        if rest:
            self._thread_flusher.start(rest)  # the next send waits for it



class UdsSyncReader(_Base, SyncReader):
    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        super().__init__(addr, connect_timeout)
        self._poller: select.poll | None = None  # the peer's socket and the wake-up fd

    def recv(self, timeout: float | None = None) -> Message:
        deadline = Deadline(timeout)
        with self._lock:
            self._check_open()
            core = self._core
            msg = core.recv_now()
            if msg is not None:
                return msg
            waited = core.streaming  # recv_now read the socket (see aio's recv)
            if waited:
                # The common wait (a stream between messages), before any generator: one
                # poll(2) on a poll object kept for the connection.
                poller = self._poller
                if poller is None:
                    poller = self._poller = select.poll()
                    poller.register(core.peers[0].sock.fileno(), _IN)
                    poller.register(self._wake.fd, _IN)
                poller.poll(deadline.remaining_ms())
                if self._closing:
                    raise ChannelClosedError(f"endpoint {self.address} was closed")
                msg = core.recv_now()
                if msg is not None:
                    return msg
            return self._run(core.recv(deadline, timeout, waited))


# ---- opening ----------------------------------------------------------------------------------
def _open(cls: type[_B], plan: K.Plan, connect_timeout: float) -> _B:
    endpoint = cls(plan.addr, connect_timeout)
    if plan.spec is not None:
        endpoint._core.bind(plan.spec, endpoint)
        return endpoint
    sock = A.connect(plan.addr, Deadline(connect_timeout), connect_timeout, plan.capacity)
    sock.sendall(plan.hello)
    plan.adopt(endpoint._core, sock)
    return endpoint


_B = TypeVar("_B", bound=_Base)


def open_writer(address: str | None, *, bind: bool, capacity: int,
                connect_timeout: float) -> UdsSyncWriter:
    plan = K.plan_writer(address, bind, capacity, connect_timeout)
    return _open(UdsSyncWriter, plan, connect_timeout)


def open_reader(address: str | None, *, bind: bool, capacity: int,
                connect_timeout: float) -> UdsSyncReader:
    plan = K.plan_reader(address, bind, capacity, connect_timeout)
    return _open(UdsSyncReader, plan, connect_timeout)


def open_broadcast_writer(address: str | None, num_readers: int, *, capacity: int,
                          connect_timeout: float) -> UdsSyncWriter:
    plan = K.plan_broadcast_writer(address, num_readers, capacity, connect_timeout)
    return _open(UdsSyncWriter, plan, connect_timeout)


def open_broadcast_reader(address: str | None, rank: int, *,
                          connect_timeout: float) -> UdsSyncReader:
    plan = K.plan_broadcast_reader(address, rank, connect_timeout)
    return _open(UdsSyncReader, plan, connect_timeout)
