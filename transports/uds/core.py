"""The uds protocol written once, without I/O: accepting the peers (hello, credential check,
reply), reading frames, checking a connecting reader's greeting and writing a frame to every
peer run as generators that yield a ``Wait`` whenever a socket would block; the driver
(``sync``: poll(2); ``aio``: the asyncio loop; ``anyio_driver``: trio) waits and resumes the
generator with ``next``. What is specific to a driver stays there: its lock, its wake-up on
``close()``, whether the binder accepts in the background (asyncio) or in its first operation,
and how a half-written frame is finished after its ``send`` gave up (a thread or a task).

Every non-blocking step is in ``stream`` (read a frame, one write pass); this module keeps the
endpoint's state: its peers, the listener, the connect deadline, the sticky error."""

from __future__ import annotations

import logging
import socket
from collections.abc import Generator

from transports._checks import check_args, check_num_readers, check_rank
from transports._deadline import Deadline, check_timeout
from transports._paths import FileCleanup
from transports.base import Message
from transports.errors import AddressError, ChannelClosedError, PeerClosedError, TransportError
from transports.uds import address as A
from transports.uds import stream as S
from transports.uds.framing import MalformedStreamError
from transports.uds.peers import HELLO_TIMEOUT, AcceptSpec, Peer, frame_bytes

log = logging.getLogger(__name__)


class Wait:
    """Until one of ``fds`` is readable (writable when ``writable``), ``deadline``, or
    ``close()``. ``kept``: the reader's own connection, which the asyncio driver keeps
    registered (``aio_kept``); ``closable``: False for a background flush, which close() lets
    finish (bounded by ``stream.LINGER``)."""

    __slots__ = ("closable", "deadline", "fds", "kept", "writable")

    def __init__(self, fds: list[int], writable: bool, deadline: Deadline,
                 kept: Peer | None = None, closable: bool = True) -> None:
        self.fds = fds
        self.writable = writable
        self.deadline = deadline
        self.kept = kept
        self.closable = closable


class UdsCore:
    """One endpoint's protocol state. ``accepting``: a binder still waiting for its peers;
    ``connected``: it connected to a binder (which may have refused it: see ``peer_gone``)."""

    __slots__ = ("accepting", "addr", "broken", "cleanup", "connect_deadline",
                 "connect_timeout", "greeted", "listener", "peers", "spec", "unsent", "url")

    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        self.addr = addr
        self.url = addr.url
        self.connect_timeout = connect_timeout
        self.connect_deadline: Deadline | None = None
        self.broken: TransportError | None = None
        self.peers: list[Peer] = []
        self.listener: socket.socket | None = None
        self.cleanup: FileCleanup | None = None
        self.spec: AcceptSpec | None = None
        self.accepting = False
        self.greeted = True  # a connecting reader first reads the binder's reply
        self.unsent: S.Pending = []  # a write's connections still owed part of the frame

    @property
    def connected(self) -> bool:
        return self.spec is None

    def bind(self, spec: AcceptSpec, owner: object) -> None:
        self.listener, self.cleanup = A.listen(self.addr, spec.count, owner)
        self.spec = spec
        self.accepting = True

    def check_usable(self, closed: bool) -> None:
        if closed:
            raise ChannelClosedError(f"endpoint {self.url} is closed")
        if self.broken is not None:
            raise type(self.broken)(str(self.broken))

    # ---- accepting ---------------------------------------------------------------------------
    def ensure_peers(self, deadline: Deadline) -> Generator[Wait, None, None]:
        """Accept until every peer is in, within ``deadline`` and the connect deadline (which
        starts at the first operation that has to wait for them)."""
        if not self.accepting:
            return
        if self.connect_deadline is None:
            self.connect_deadline = Deadline(self.connect_timeout)
        yield from self.accept_all(Deadline.earliest(deadline, self.connect_deadline))

    def accept_all(self, deadline: Deadline) -> Generator[Wait, None, None]:
        spec, listener = self.spec, self.listener
        assert spec is not None and listener is not None
        while len(self.peers) < spec.count:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                if deadline.expired():
                    raise self.accept_timeout() from None
                yield Wait([listener.fileno()], False, deadline)
                continue
            yield from self._admit(spec, sock)
        self.peers.sort(key=lambda p: p.rank)
        # Everyone is here: nothing may connect any more, and nothing stays on disk.
        self.accepting = False
        listener.close()
        self.listener = None
        if self.cleanup is not None:
            self.cleanup.run()

    def _admit(self, spec: AcceptSpec, sock: socket.socket) -> Generator[Wait, None, None]:
        sock.setblocking(False)
        if spec.sndbuf is not None:
            A.set_sndbuf(sock, spec.sndbuf)
        peer = Peer(sock)
        try:
            hello = yield from self.read_frame(peer, Deadline(HELLO_TIMEOUT), fatal=False)
        except (PeerClosedError, MalformedStreamError):
            hello = None
        except BaseException:
            sock.close()
            raise
        if hello is None:
            log.warning("a connection to %s sent no hello; dropped", self.url)
            sock.close()
            return
        rank = spec.admit(sock, bytes(hello.header))
        if rank is not None:
            peer.rank = rank
            self.peers.append(peer)

    def accept_timeout(self) -> TimeoutError:
        assert self.spec is not None
        expired = self.connect_deadline is not None and self.connect_deadline.expired()
        return S.accept_timeout(self.spec, self.url, len(self.peers), expired,
                                self.connect_timeout)

    # ---- reading -----------------------------------------------------------------------------
    def read_frame(self, peer: Peer, deadline: Deadline, fatal: bool = True,
                   waited: bool = False) -> Generator[Wait, None, Message | None]:
        """The next frame from ``peer``; None on timeout; PeerClosedError at EOF (which, like a
        malformed stream, breaks the endpoint when ``fatal``). ``waited``: the caller just
        found nothing to read, so the first step is the wait."""
        kept = peer if fatal else None  # a hello's socket may be closed soon after
        while True:
            if waited:
                yield Wait([peer.sock.fileno()], False, deadline, kept)
            try:
                msg = S.read_step(peer, self.url)
            except (PeerClosedError, MalformedStreamError) as e:
                if fatal:
                    self.broken = e
                raise
            if msg is not None or deadline.expired():
                return msg
            waited = True

    @property
    def streaming(self) -> bool:
        """A reader past its set-up (peers in, greeting read): ``recv_now`` reads its peer."""
        return not self.accepting and self.greeted

    def recv_now(self) -> Message | None:
        """A reader's next message if one is here and nothing else is pending (the peers in,
        the greeting read); None means: wait for its socket (when ``streaming``) or run
        ``recv``."""
        if self.accepting or not self.greeted:
            return None
        try:
            return S.read_step(self.peers[0], self.url)
        except (PeerClosedError, MalformedStreamError) as e:
            self.broken = e
            raise

    def recv(self, deadline: Deadline, timeout: float | None,
             waited: bool = False) -> Generator[Wait, None, Message]:
        """The next message (``waited``: ``recv_now`` just read the socket and found no whole
        frame, so the first step is the wait; never after the driver accepted the peers: the
        hello's read may have brought the first frame into the buffer)."""
        if self.accepting:
            yield from self.ensure_peers(deadline)
            waited = False
        peer = self.peers[0]
        while True:
            msg = yield from self.read_frame(peer, deadline, waited=waited)
            if msg is None:
                raise TimeoutError(f"no message on {self.url} within {timeout} s")
            if self.greeted:
                return msg
            try:
                S.check_greeting(msg, self.url)
            except AddressError as e:
                self.broken = e
                raise
            self.greeted = True
            waited = False

    # ---- writing -----------------------------------------------------------------------------
    def write_now(self, outs: S.Pending) -> S.Pending:
        """One write pass of a new frame (``outs``: one per peer); returns the connections it
        is not done on (pass them to ``write``)."""
        try:
            return S.write_pass(outs, self.url, self.connected)
        except PeerClosedError as e:
            self.broken = e
            raise

    def write(self, outs: S.Pending, deadline: Deadline, stash: bool,
              pending: S.Pending | None = None) -> Generator[Wait, None, S.Pending]:
        """Write one frame (``outs``: one per peer) until it is out: returns []; or, when
        ``stash`` and time is up with part of it on the wire, what is left for the driver to
        finish in the background. ``unsent`` holds the rest while it waits. ``pending``: what
        ``write_now`` left (the first step is then the wait)."""
        tried = pending is not None
        pending = outs if pending is None else pending
        while True:
            try:
                if tried:
                    pending, move = S.write_move(outs, pending, deadline, self.url, stash)
                    tried = False
                else:
                    pending, move = S.write_step(outs, pending, deadline, self.url,
                                                 self.connected, stash)
            except PeerClosedError as e:
                self.broken = e
                raise
            if move == S.DONE:
                self.unsent = []
                return []
            if move == S.STASH:
                self.unsent = []
                return pending
            self.unsent = pending
            yield Wait([p.sock.fileno() for p, _ in pending], True, deadline, closable=stash)

    def close_sockets(self) -> None:
        for peer in self.peers:
            peer.sock.close()
        if self.listener is not None:
            self.listener.close()
        if self.cleanup is not None:
            self.cleanup.run()


class Plan:
    """How an ``open_*`` sets its endpoint up: bind with ``spec``, or connect as ``role`` and
    ``rank`` (``capacity``: a writer's send buffer). The same for every driver."""

    __slots__ = ("addr", "capacity", "rank", "role", "spec")

    def __init__(self, addr: A.UdsAddress, spec: AcceptSpec | None, role: int = A.WRITER,
                 rank: int = -1, capacity: int | None = None) -> None:
        self.addr, self.spec, self.role, self.rank, self.capacity = (
            addr, spec, role, rank, capacity)

    @property
    def hello(self) -> bytes:
        """What the connector sends right after connect()."""
        return frame_bytes(A.hello(self.role, self.rank))

    def adopt(self, core: UdsCore, sock: socket.socket) -> None:
        """The connected socket becomes ``core``'s one peer; a reader reads the binder's reply
        (its greeting) before its first message."""
        sock.setblocking(False)
        core.peers.append(Peer(sock, self.rank))
        core.greeted = self.role != A.READER


def plan_writer(address: str | None, bind: bool, capacity: int,
                connect_timeout: float) -> Plan:
    check_args(capacity, connect_timeout)
    addr = A.parse(address, binding=bind)
    if bind:
        return Plan(addr, AcceptSpec(addr.url, A.READER, 1, None, capacity))
    return Plan(addr, None, A.WRITER, -1, capacity)


def plan_reader(address: str | None, bind: bool, capacity: int,
                connect_timeout: float) -> Plan:
    check_args(capacity, connect_timeout)
    addr = A.parse(address, binding=bind)
    if bind:
        return Plan(addr, AcceptSpec(addr.url, A.WRITER, 1, None))
    return Plan(addr, None, A.READER)


def plan_broadcast_writer(address: str | None, num_readers: int, capacity: int,
                          connect_timeout: float) -> Plan:
    check_args(capacity, connect_timeout)
    check_num_readers(num_readers)
    addr = A.parse(address, binding=True)
    return Plan(addr, AcceptSpec(addr.url, A.READER, num_readers, num_readers, capacity))


def plan_broadcast_reader(address: str | None, rank: int, connect_timeout: float) -> Plan:
    check_timeout(connect_timeout, "connect_timeout")
    check_rank(rank)
    return Plan(A.parse(address, binding=False), None, A.READER, rank)
