"""Blocking uds endpoints (for busy loops). Each waits in poll(2) on its socket(s) plus a
wake-up fd, so ``close()`` from another thread interrupts any wait at once."""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Sequence

from transports._buffers import message_views
from transports._checks import check_args, check_num_readers, check_rank
from transports._deadline import Deadline, check_timeout
from transports._paths import FileCleanup
from transports._wakeup import Wakeup
from transports.base import Buffer, Endpoint, Message, SyncReader, SyncWriter
from transports.errors import AddressError, ChannelClosedError, PeerClosedError, TransportError
from transports.uds import address as A
from transports.uds import stream as S
from transports.uds.framing import PREFIX, MalformedStreamError, frame_parts
from transports.uds.outbound import SEND_FLAGS, Outbound
from transports.uds.peers import HELLO_TIMEOUT, AcceptSpec, Peer, frame_bytes

log = logging.getLogger(__name__)

_IN, _OUT = select.POLLIN, select.POLLOUT
SMALL_FRAME = 64 * 1024  # a header up to this size goes out by _send_small (one copy of it)


class _Base(Endpoint):
    """Peer bookkeeping, waiting and closing shared by the sync reader and writer."""

    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        self._addr = addr
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()  # one operation at a time; close() waits for it
        self._wake = Wakeup()
        self._closing = False
        self._closed = False
        self._broken: TransportError | None = None
        self._peers: list[Peer] = []
        self._listener: socket.socket | None = None
        self._cleanup: FileCleanup | None = None
        self._accept: AcceptSpec | None = None
        self._connect_deadline: Deadline | None = None

    @property
    def address(self) -> str:
        return self._addr.url

    # ---- binding side ------------------------------------------------------------------------
    def _bind(self, spec: AcceptSpec) -> None:
        self._listener, self._cleanup = A.listen(self._addr, spec.count, self)
        self._accept = spec

    def _ensure_peers(self, deadline: Deadline) -> None:
        spec = self._accept
        if spec is None or len(self._peers) == spec.count:
            return
        if self._connect_deadline is None:
            self._connect_deadline = Deadline(self._connect_timeout)
        wait = Deadline.earliest(deadline, self._connect_deadline)
        assert self._listener is not None
        while len(self._peers) < spec.count:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                if wait.expired():
                    raise self._accept_timeout(spec) from None
                self._poll([(self._listener.fileno(), _IN)], wait)
                continue
            self._admit(spec, sock)
        self._peers.sort(key=lambda p: p.rank)
        # Everyone is here: nothing may connect any more, and nothing stays on disk.
        self._listener.close()
        self._listener = None
        if self._cleanup is not None:
            self._cleanup.run()

    def _admit(self, spec: AcceptSpec, sock: socket.socket) -> None:
        sock.setblocking(False)
        if spec.sndbuf is not None:
            A.set_sndbuf(sock, spec.sndbuf)
        peer = Peer(sock)
        try:
            hello = self._read_frame(peer, Deadline(HELLO_TIMEOUT), fatal=False)
        except (PeerClosedError, MalformedStreamError):
            hello = None
        if hello is None:
            log.warning("a connection to %s sent no hello; dropped", self.address)
            sock.close()
            return
        rank = spec.admit(sock, bytes(hello.header))
        if rank is not None:
            peer.rank = rank
            self._peers.append(peer)

    def _accept_timeout(self, spec: AcceptSpec) -> TimeoutError:
        assert self._connect_deadline is not None
        return S.accept_timeout(spec, self.address, len(self._peers),
                                self._connect_deadline.expired(), self._connect_timeout)

    # ---- waiting -----------------------------------------------------------------------------
    def _poll(self, fds: list[tuple[int, int]], deadline: Deadline) -> list[tuple[int, int]]:
        poller = select.poll()
        for fd, ev in fds:
            poller.register(fd, ev)
        poller.register(self._wake.fd, _IN)
        events = poller.poll(deadline.remaining_ms())
        if self._closing:
            raise ChannelClosedError(f"endpoint {self.address} was closed")
        return events

    def _read_frame(self, peer: Peer, deadline: Deadline, fatal: bool = True) -> Message | None:
        """The next frame from ``peer``; None on timeout; PeerClosedError at EOF (which, like a
        malformed stream, breaks the endpoint when ``fatal``)."""
        while True:
            try:
                msg = S.read_step(peer, self.address)
            except (PeerClosedError, MalformedStreamError) as e:
                if fatal:
                    self._broken = e
                raise
            if msg is not None or deadline.expired():
                return msg
            self._poll([(peer.sock.fileno(), _IN)], deadline)

    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise ChannelClosedError(f"endpoint {self.address} is closed")
        if self._broken is not None:
            raise type(self._broken)(str(self._broken))

    # ---- closing -----------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._before_close()
        self._closing = True
        self._wake.signal()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._after_close()
            for peer in self._peers:
                peer.sock.close()
            if self._listener is not None:
                self._listener.close()
            if self._cleanup is not None:
                self._cleanup.run()

    def _before_close(self) -> None:
        pass

    def _after_close(self) -> None:
        pass


class UdsSyncWriter(_Base, SyncWriter):
    """Point-to-point (one peer) or broadcast (``num_readers`` peers) writer."""

    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        super().__init__(addr, connect_timeout)
        self._flusher: threading.Thread | None = None
        self._flush_error: TransportError | None = None

    def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
             timeout: float | None = None) -> None:
        if not buffers and timeout is None and type(header) is bytes \
                and len(header) <= SMALL_FRAME and self._send_small(header):
            return
        deadline = Deadline(timeout)
        parts = frame_parts(*message_views(header, buffers))
        with self._lock:
            self._check_open()
            self._ensure_peers(deadline)
            self._join_flusher(deadline)
            outs = [(peer, Outbound(parts)) for peer in self._peers]
            self._write(outs, deadline, stash_on_timeout=True)

    def _send_small(self, header: bytes) -> bool:
        """The commonest send (one small frame to one connected reader, no timeout) in one
        non-blocking ``send``, skipping the general path's per-call set-up (~15 us of Python
        that, in an engine, holds the GIL its model needs). False when the general path must
        do it: more readers or none yet, a frame still going out in the background, a closed
        or broken endpoint, or a socket error (nothing was written then)."""
        with self._lock:
            peers = self._peers
            if len(peers) != 1 or self._listener is not None or self._flusher is not None \
                    or self._closing or self._closed or self._broken is not None:
                return False
            frame = PREFIX.pack(len(header), 0) + header
            sock = peers[0].sock
            try:
                n = sock.send(frame, SEND_FLAGS)
            except BlockingIOError:
                n = 0
            except OSError:
                return False
            if n < len(frame):  # the rest, as the general path would: wait, or finish later
                out = Outbound([memoryview(frame)[n:]])
                out.started = n > 0
                self._write([(peers[0], out)], Deadline(None), stash_on_timeout=True)
            return True

    def _write(self, outs: S.Pending, deadline: Deadline, stash_on_timeout: bool) -> None:
        pending = outs
        while True:
            try:
                pending, move = S.write_step(outs, pending, deadline, self.address,
                                             self._accept is None, stash_on_timeout)
            except PeerClosedError as e:
                self._broken = e
                raise
            if move == S.DONE:
                return
            if move == S.STASH:
                self._start_flusher(pending)  # the next send waits for it
                return
            self._poll([(peer.sock.fileno(), _OUT) for peer, _ in pending], deadline)

    def _start_flusher(self, pending: S.Pending) -> None:
        for _, out in pending:
            out.detach()
        self._flusher = threading.Thread(target=self._flush, args=(pending,), daemon=True,
                                         name="aiot-uds-flush")
        self._flusher.start()

    def _flush(self, pending: S.Pending) -> None:
        try:
            self._write(pending, Deadline(None), stash_on_timeout=False)
        except ChannelClosedError:
            pass
        except TransportError as e:
            self._flush_error = e

    def _join_flusher(self, deadline: Deadline) -> None:
        if self._flusher is None:
            return
        self._flusher.join(deadline.remaining())
        if self._flusher.is_alive():
            raise S.full_error(self.address)
        self._flusher = None
        if self._flush_error is not None:
            raise self._flush_error

    def _before_close(self) -> None:
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join(S.LINGER)

    def _after_close(self) -> None:
        if self._flusher is not None:
            self._flusher.join()


class UdsSyncReader(_Base, SyncReader):
    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        super().__init__(addr, connect_timeout)
        self._greeted = True  # a connecting reader first reads the binder's reply

    def recv(self, timeout: float | None = None) -> Message:
        deadline = Deadline(timeout)
        with self._lock:
            self._check_open()
            self._ensure_peers(deadline)
            peer = self._peers[0]
            while True:
                msg = self._read_frame(peer, deadline)
                if msg is None:
                    raise TimeoutError(f"no message on {self.address} within {timeout} s")
                if self._greeted:
                    return msg
                try:
                    S.check_greeting(msg, self.address)
                except AddressError as e:
                    self._broken = e
                    raise
                self._greeted = True


# ---- opening ----------------------------------------------------------------------------------
def _connected(endpoint: _Base, role: int, rank: int, capacity: int | None) -> None:
    deadline = Deadline(endpoint._connect_timeout)
    sock = A.connect(endpoint._addr, deadline, endpoint._connect_timeout, capacity)
    sock.sendall(frame_bytes(A.hello(role, rank)))
    sock.setblocking(False)
    endpoint._peers.append(Peer(sock, rank))


def open_writer(address: str | None, *, bind: bool, capacity: int,
                connect_timeout: float) -> UdsSyncWriter:
    check_args(capacity, connect_timeout)
    w = UdsSyncWriter(A.parse(address, binding=bind), connect_timeout)
    if bind:
        w._bind(AcceptSpec(w.address, A.READER, 1, None, capacity))
    else:
        _connected(w, A.WRITER, -1, capacity)
    return w


def open_reader(address: str | None, *, bind: bool, capacity: int,
                connect_timeout: float) -> UdsSyncReader:
    check_args(capacity, connect_timeout)
    r = UdsSyncReader(A.parse(address, binding=bind), connect_timeout)
    if bind:
        r._bind(AcceptSpec(r.address, A.WRITER, 1, None))
    else:
        r._greeted = False
        _connected(r, A.READER, -1, None)
    return r


def open_broadcast_writer(address: str | None, num_readers: int, *, capacity: int,
                          connect_timeout: float) -> UdsSyncWriter:
    check_args(capacity, connect_timeout)
    check_num_readers(num_readers)
    w = UdsSyncWriter(A.parse(address, binding=True), connect_timeout)
    w._bind(AcceptSpec(w.address, A.READER, num_readers, num_readers, capacity))
    return w


def open_broadcast_reader(address: str | None, rank: int, *,
                          connect_timeout: float) -> UdsSyncReader:
    check_timeout(connect_timeout, "connect_timeout")
    check_rank(rank)
    r = UdsSyncReader(A.parse(address, binding=False), connect_timeout)
    r._greeted = False
    _connected(r, A.READER, rank, None)
    return r
