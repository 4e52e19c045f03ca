"""One zmq endpoint's sockets and peer state, shared by the blocking and asyncio fronts.

Sockets: PUSH/PULL for point-to-point, XPUB/SUB for broadcast. Each endpoint has its own
context and a monitor socket, from which we learn that the peer connected (handshake) and that
it went away (disconnect, SIGKILL included; TCP keepalive covers a silent remote host). Broadcast
readers subscribe to everything plus one topic naming their rank, so the XPUB writer (verbose)
sees exactly which ranks are present and which one left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from time import monotonic

import zmq
from zmq.utils.monitor import parse_monitor_message

from transports._paths import FileCleanup
from transports.base import Message
from transports.errors import AddressError, PeerClosedError, TransportError
from transports.zmq.address import ZmqAddress

log = logging.getLogger(__name__)

# A closing writer gets this long to flush its queued messages to a live peer: a process's last
# words (an engine's failure and the per-request errors before it exits) must survive a machine
# so loaded that libzmq's I/O thread waits seconds for a CPU. It ends as soon as the queue is
# written out; a peer known to be gone gets no linger at all (``closing_linger``).
LINGER_MS = 10_000
COPY_BELOW = 64 * 1024  # smaller frames are copied (cheaper than zero-copy bookkeeping)
RANK_TOPIC = b"\xffaiot-rank:"
DEFAULT_READER_CAPACITY = 64 * 1024 * 1024  # broadcast readers get no capacity argument
LOOK_EVERY = 0.05  # seconds between looks at the monitor on the small-send fast path
_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED
           | zmq.EVENT_CONNECTED)
PUSH, PULL, XPUB, SUB = zmq.PUSH, zmq.PULL, zmq.XPUB, zmq.SUB
# Plain ints: pyzmq's are IntFlag/IntEnum, and each ``&``/``|`` on them builds an enum member
# (~1 us on the hot path: every send and receive asks ZMQ_EVENTS).
EVENTS, POLLIN, POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
NOBLOCK, NOBLOCK_MORE = int(zmq.NOBLOCK), int(zmq.NOBLOCK | zmq.SNDMORE)


def hwm_for(capacity: int) -> int:
    """zmq counts messages, not bytes: one message per 64 KiB of capacity, 1..1000 per side."""
    return max(1, min(capacity // COPY_BELOW, 1000))


class Channel:
    def __init__(self, owner: object, kind: int, addr: ZmqAddress, *, bind: bool, hwm: int,
                 num_readers: int | None = None, rank: int | None = None) -> None:
        self.kind = kind
        self.bind = bind
        self.num_readers = num_readers
        self.ctx = zmq.Context(io_threads=1)
        self.sock = self.ctx.socket(kind)
        self.mon: zmq.Socket[bytes] | None = None
        self.closed = False
        self.handshakes = 0
        self.ranks: set[int] = set()
        self.gone: str | None = None  # why the peer is known gone
        self.error: TransportError | None = None  # a protocol violation (extra peer, bad rank)
        self.url = addr.url
        self._next_look = 0.0  # monotonic time of send_small's next look at the monitor
        # Removes an explicit ipc path's socket file on close or garbage collection.
        self._cleanup = FileCleanup(owner, addr.ipc_path if bind else None)
        try:
            self._setup(addr, hwm, rank)
        except BaseException:
            self.close(linger_ms=0)
            raise

    def _setup(self, addr: ZmqAddress, hwm: int, rank: int | None) -> None:
        s = self.sock
        s.linger = 0
        s.sndhwm = hwm
        s.rcvhwm = hwm
        s.sndbuf = s.rcvbuf = max(4096, min(hwm * COPY_BELOW, 4 * 1024 * 1024))  # kernel part
        if addr.endpoint.startswith("tcp://"):
            # A silent remote host is found by kernel keepalives. Not ZMTP heartbeats: those
            # queue behind data, so a reader that is merely slow would be declared dead.
            s.setsockopt(zmq.TCP_KEEPALIVE, 1)
            s.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 10)
            s.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 2)
            s.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)
        if "[" in addr.endpoint:
            s.ipv6 = True
        if self.kind == XPUB:
            s.setsockopt(zmq.XPUB_VERBOSE, 1)
            s.setsockopt(zmq.XPUB_NODROP, 1)  # block (backpressure), never drop silently
        if self.kind == SUB:
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.setsockopt(zmq.SUBSCRIBE, RANK_TOPIC + str(rank).encode())
        if self.bind and addr.endpoint.startswith("ipc://"):
            # An abstract name has no file permissions to keep other users out, and a
            # filesystem path may sit in a shared directory: libzmq drops connections from
            # processes of another uid (SO_PEERCRED) before they reach us.
            s.setsockopt(zmq.IPC_FILTER_UID, os.getuid())
        self.mon = s.get_monitor_socket(_EVENTS)
        try:
            if self.bind:
                s.bind(addr.endpoint)
            else:
                s.connect(addr.endpoint)
        except zmq.ZMQError as e:
            verb = "bind" if self.bind else "connect to"
            raise AddressError(f"cannot {verb} {addr.url}: {e.strerror}") from e
        if self.bind:
            self.url = "zmq+" + s.getsockopt_string(zmq.LAST_ENDPOINT)
            if addr.ipc_path is not None:
                os.chmod(addr.ipc_path, 0o600)  # only our user may connect through the file

    # ---- peer state ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        if self.kind == XPUB:
            return len(self.ranks) == self.num_readers
        return self.handshakes > 0

    def process_events(self) -> None:
        """Drain monitor events (and XPUB subscriptions) without blocking.

        Called before every send: each socket is asked ``ZMQ_EVENTS`` first (holds the GIL,
        ~2 us) instead of a ``recv(NOBLOCK)`` that raises ``zmq.Again`` (~5 us, and it lets go
        of the GIL, which costs a model loop sharing this process a wake-up to get it back)."""
        mon = self.mon
        while mon is not None and mon.getsockopt(EVENTS) & POLLIN:  # type: ignore[operator]  # an int option
            try:
                frames = mon.recv_multipart(NOBLOCK)
            except zmq.Again:
                break
            event = parse_monitor_message(frames)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshakes += 1
                if self.kind in (PUSH, PULL) and self.handshakes > 1 and self.error is None:
                    self.error = TransportError(
                        f"a second peer connected to point-to-point channel {self.url}")
            elif event == zmq.EVENT_DISCONNECTED and self.handshakes and self.gone is None:
                self.gone = "disconnected"
        if self.kind == XPUB:
            self._process_subscriptions()

    def _process_subscriptions(self) -> None:
        while self.sock.getsockopt(EVENTS) & POLLIN:  # type: ignore[operator]  # an int option
            try:
                sub = self.sock.recv(NOBLOCK)
            except zmq.Again:
                return
            topic = sub[1:]
            if not topic.startswith(RANK_TOPIC):
                continue
            rank = int(topic[len(RANK_TOPIC):])
            if sub[:1] == b"\x00":
                self.ranks.discard(rank)
                self.gone = self.gone or f"broadcast reader rank {rank} disconnected"
            elif not 0 <= rank < (self.num_readers or 0):
                self.error = AddressError(f"rank {rank} connected to {self.url}, a broadcast to "
                                          f"{self.num_readers} readers")
            elif rank in self.ranks:
                self.error = AddressError(f"rank {rank} connected twice to {self.url}")
            else:
                self.ranks.add(rank)

    def check_peer(self) -> None:
        if self.error is not None:
            raise self.error
        if self.gone is not None:
            raise PeerClosedError(f"the peer of {self.url} is gone ({self.gone})")

    # ---- data ----------------------------------------------------------------------------------
    def try_recv(self) -> Message | None:
        if not self.sock.getsockopt(EVENTS) & POLLIN:  # type: ignore[operator]  # an int option
            return None  # cheaper than a recv raising zmq.Again (see process_events)
        sock = self.sock
        try:
            head = sock.recv(NOBLOCK, copy=False)
        except zmq.Again:
            return None
        # A multipart message arrives whole; Frame.more saves recv_multipart's RCVMORE lookups.
        parts = []
        more = head.more
        while more:
            part = sock.recv(NOBLOCK, copy=False)
            parts.append(part.buffer)
            more = part.more
        return Message(head.buffer, parts)

    def try_send(self, frames: list[memoryview]) -> list[zmq.MessageTracker] | None:
        """Queue one message, all or nothing. Returns trackers of the caller's writable large
        buffers (zmq reads them later), or None if the channel is full."""
        trackers: list[zmq.MessageTracker] = []
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            flags = NOBLOCK_MORE if i < last else NOBLOCK
            big = len(frame) >= COPY_BELOW
            track = big and not frame.readonly
            try:
                t = self.sock.send(frame, flags, copy=not big, track=track)
            except zmq.Again:
                if i == 0:
                    return None
                raise  # later parts of an accepted message are never refused
            if track and t is not None:
                trackers.append(t)
        return trackers

    def recv_step(self) -> Message | None:
        """One non-blocking receive for either front: a message, or None (wait, then call
        again). Once the peer is gone, what it sent before leaving still comes first; then
        PeerClosedError."""
        msg = self.try_recv()
        if msg is not None:
            return msg
        self.process_events()
        if self.gone is None and self.error is None:
            return None
        msg = self.try_recv()
        if msg is None:
            self.check_peer()
        return msg

    def send_small(self, data: bytes) -> bool:
        """The hot path of a point-to-point (PUSH) writer: one small frame, copied, without
        blocking; False if the channel is full or not connected yet (nothing sent). The monitor
        is looked at once per ``LOOK_EVERY`` s rather than per message: that look is a poll
        syscall made with the GIL held (~3 us), and an engine's output thread that holds the GIL
        when the model thread comes back from a torch op puts the model to sleep until it lets
        go (uniproc engine: ~1.3 such sleeps per token). A departed peer or a second one is
        still reported, at most ``LOOK_EVERY`` s later than its monitor event."""
        if not self.handshakes:
            return False  # not connected yet: the general path waits for the peer
        now = monotonic()
        if now >= self._next_look:
            self._next_look = now + LOOK_EVERY
            self.process_events()
        if self.gone is not None or self.error is not None:
            self.check_peer()
        try:
            self.sock.send(data, NOBLOCK)
        except zmq.Again:
            return False
        return True

    def send_step(self, frames: list[memoryview]) -> list[zmq.MessageTracker] | None:
        """One non-blocking send for either front: ``try_send``'s answer, after raising
        PeerClosedError if the peer is gone."""
        self.process_events()
        self.check_peer()
        return self.try_send(frames)

    def has(self, event: int) -> bool:
        return bool(self.sock.getsockopt(EVENTS) & event)  # type: ignore[operator]  # an int option

    def mon_has_events(self) -> bool:
        return self.mon is not None and bool(self.mon.getsockopt(EVENTS) & POLLIN)  # type: ignore[operator]  # an int option

    # ---- closing -------------------------------------------------------------------------------
    def closing_linger(self, writer: bool) -> int:
        """The linger for closing this endpoint: ``LINGER_MS`` for a writer whose peer is still
        there (looked at now: a departed peer would hold the close for the whole linger while
        libzmq waits to reconnect), else 0."""
        if not writer or self.closed or not self.ready:
            return 0
        try:
            self.process_events()
        except zmq.ZMQError as exc:
            log.debug("%s: could not read peer events before closing: %s", self.url, exc)
            return 0
        return LINGER_MS if self.gone is None and self.error is None else 0

    def close(self, linger_ms: int, background: bool = False) -> None:
        """Close sockets and the context. A writer passes ``LINGER_MS`` so queued messages still
        reach a live peer; ``background`` terminates the context in a thread (asyncio fronts)."""
        if self.closed:
            return
        self.closed = True
        if self.mon is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.sock.disable_monitor()
            self.mon.close(linger=0)
            self.mon = None
        self.sock.close(linger=linger_ms)
        self._cleanup.run()  # the file goes now; zmq's own unlink later finds nothing
        if background and linger_ms:
            # term() waits for the linger; an event loop must not wait with it.
            threading.Thread(target=self.ctx.term, daemon=True, name="aiot-zmq-term").start()
        else:
            self.ctx.term()
