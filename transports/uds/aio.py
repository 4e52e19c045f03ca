"""asyncio uds endpoints: non-blocking sockets driven by ``loop.add_reader``/``add_writer``.

Bytes move only in synchronous steps between awaits (into the frame reader's buffer), so a
cancelled ``recv`` loses nothing: the next one finds the data where the last one left it. The
reader's connection stays registered from its first wait until close (``aio_kept``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import weakref
from collections.abc import Awaitable, Callable, Sequence

from transports._buffers import message_views
from transports._checks import check_args, check_num_readers, check_rank
from transports._deadline import Deadline, check_timeout
from transports._paths import FileCleanup
from transports.base import AsyncReader, AsyncWriter, Buffer, Endpoint, Message
from transports.errors import AddressError, ChannelClosedError, PeerClosedError, TransportError
from transports.uds import address as A
from transports.uds import stream as S
from transports.uds.aio_kept import KeptReadable
from transports.uds.framing import MalformedStreamError, frame_parts
from transports.uds.outbound import Outbound
from transports.uds.peers import HELLO_TIMEOUT, AcceptSpec, Peer, frame_bytes

log = logging.getLogger(__name__)

WaitReadable = Callable[[Peer, Deadline], Awaitable[None]]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _AsyncBase(Endpoint):
    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._addr = addr
        self._connect_timeout = connect_timeout
        self._lock = asyncio.Lock()
        self._closed = False
        self._broken: TransportError | None = None
        self._peers: list[Peer] = []
        self._waiters: set[asyncio.Future[None]] = set()
        self._listener: socket.socket | None = None
        self._cleanup: FileCleanup | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._spec: AcceptSpec | None = None
        self._connect_deadline: Deadline | None = None

    @property
    def address(self) -> str:
        return self._addr.url

    # ---- binding side: a background task accepts, so connectors never wait for our first op --
    def _bind(self, spec: AcceptSpec) -> None:
        self._listener, self._cleanup = A.listen(self._addr, spec.count, self)
        self._accept_task = self._loop.create_task(self._accept_all(spec))
        self._accept_task.add_done_callback(_retrieve)
        self._spec = spec

    async def _accept_all(self, spec: AcceptSpec) -> None:
        assert self._listener is not None
        while len(self._peers) < spec.count:
            sock, _ = await self._loop.sock_accept(self._listener)
            sock.setblocking(False)
            if spec.sndbuf is not None:
                A.set_sndbuf(sock, spec.sndbuf)
            peer = Peer(sock)
            try:
                hello = await self._read_frame(peer, Deadline(HELLO_TIMEOUT), fatal=False)
            except (PeerClosedError, MalformedStreamError):
                hello = None
            if hello is None:
                log.warning("a connection to %s sent no hello; dropped", self.address)
                sock.close()
                continue
            rank = spec.admit(sock, bytes(hello.header))
            if rank is not None:
                peer.rank = rank
                self._peers.append(peer)
        self._peers.sort(key=lambda p: p.rank)
        self._listener.close()
        self._listener = None
        if self._cleanup is not None:
            self._cleanup.run()

    async def _ensure_peers(self, deadline: Deadline) -> None:
        task = self._accept_task
        if task is None:
            return
        if not task.done():
            if self._connect_deadline is None:
                self._connect_deadline = Deadline(self._connect_timeout)
            wait = Deadline.earliest(deadline, self._connect_deadline)
            fut: asyncio.Future[None] = self._loop.create_future()
            task.add_done_callback(lambda _t: _wake(fut))
            await self._wait_future(fut, wait)
            if not task.done():
                assert self._spec is not None
                raise S.accept_timeout(self._spec, self.address, len(self._peers),
                                       self._connect_deadline.expired(), self._connect_timeout)
        if task.cancelled():
            raise ChannelClosedError(f"endpoint {self.address} is closed")
        exc = task.exception()
        if exc is not None:
            raise exc
        self._accept_task = None

    # ---- waiting -----------------------------------------------------------------------------
    async def _wait_future(self, fut: asyncio.Future[None], deadline: Deadline,
                           interruptible: bool = True) -> None:
        """Await ``fut`` until ``deadline``; returns on timeout too (callers check the deadline);
        raises ChannelClosedError when closed meanwhile (unless not ``interruptible``)."""
        if interruptible:
            self._waiters.add(fut)
        left = deadline.remaining()
        timer = None if left is None else self._loop.call_later(left, _wake, fut)
        try:
            await fut
        finally:
            self._waiters.discard(fut)
            if timer is not None:
                timer.cancel()
        # Woken, then closed before we ran again: close() found ``fut`` already done.
        if interruptible and self._closed:
            raise ChannelClosedError(f"endpoint {self.address} was closed")

    async def _wait_fds(self, fds: list[int], writable: bool, deadline: Deadline,
                        interruptible: bool = True) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        add = self._loop.add_writer if writable else self._loop.add_reader
        remove = self._loop.remove_writer if writable else self._loop.remove_reader
        for fd in fds:
            add(fd, _wake, fut)
        try:
            await self._wait_future(fut, deadline, interruptible)
        finally:
            # After close() the fds are unregistered and closed; their numbers may be reused.
            if not self._closed or not interruptible:
                for fd in fds:
                    remove(fd)

    async def _read_frame(self, peer: Peer, deadline: Deadline, fatal: bool = True,
                          wait: WaitReadable | None = None) -> Message | None:
        """The next frame from ``peer``; None on timeout; PeerClosedError at EOF (which, like a
        malformed stream, breaks the endpoint when ``fatal``). ``wait``: how to wait for the
        socket, by default registered for that wait only (the reader's recv passes one that
        keeps it registered; a hello's socket may be closed soon after)."""
        while True:
            try:
                msg = S.read_step(peer, self.address)
            except (PeerClosedError, MalformedStreamError) as e:
                if fatal:
                    self._broken = e
                raise
            if msg is not None or deadline.expired():
                return msg
            if wait is not None:
                await wait(peer, deadline)
            else:
                await self._wait_fds([peer.sock.fileno()], False, deadline)

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"endpoint {self.address} is closed")
        if self._broken is not None:
            raise type(self._broken)(str(self._broken))

    # ---- closing -----------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_exception(ChannelClosedError(f"endpoint {self.address} was closed"))
        if self._accept_task is not None:
            self._accept_task.cancel()
        if not self._defer_close():
            self._close_sockets()

    def _defer_close(self) -> bool:
        return False

    def _close_sockets(self) -> None:
        for peer in self._peers:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(peer.sock.fileno())
                self._loop.remove_writer(peer.sock.fileno())
            peer.sock.close()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
        if self._cleanup is not None:
            self._cleanup.run()


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved; ops re-raise it


class UdsAsyncWriter(_AsyncBase, AsyncWriter):
    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        super().__init__(addr, connect_timeout)
        self._flusher: asyncio.Task[None] | None = None

    async def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
                   timeout: float | None = None) -> None:
        deadline = Deadline(timeout)
        parts = frame_parts(*message_views(header, buffers))
        async with self._lock:
            self._check_open()
            await self._ensure_peers(deadline)
            await self._join_flusher(deadline)
            await self._write([(p, Outbound(parts)) for p in self._peers], deadline, stash=True)

    async def _write(self, outs: S.Pending, deadline: Deadline, stash: bool) -> None:
        pending = outs
        while True:
            try:
                pending, move = S.write_step(outs, pending, deadline, self.address,
                                             self._spec is None, stash)
            except PeerClosedError as e:
                self._broken = e
                raise
            if move == S.DONE:
                return
            if move == S.STASH:
                self._start_flusher(pending)
                return
            try:
                # The background flusher keeps going after close() (bounded by LINGER).
                await self._wait_fds([p.sock.fileno() for p, _ in pending], True, deadline,
                                     interruptible=stash)
            except asyncio.CancelledError:
                # A half-written frame must complete or the stream breaks: finish it from a copy.
                if stash and any(out.started for _, out in outs) and not self._closed:
                    self._start_flusher(pending)
                raise

    def _start_flusher(self, pending: S.Pending) -> None:
        for _, out in pending:
            out.detach()
        self._flusher = self._loop.create_task(self._flush(pending))
        self._flusher.add_done_callback(_retrieve)

    async def _flush(self, pending: S.Pending) -> None:
        try:
            await self._write(pending, Deadline(None), stash=False)
        finally:
            if self._closed:
                self._close_sockets()

    async def _join_flusher(self, deadline: Deadline) -> None:
        flusher = self._flusher
        if flusher is None:
            return
        if not flusher.done():
            fut: asyncio.Future[None] = self._loop.create_future()
            flusher.add_done_callback(lambda _t: _wake(fut))
            await self._wait_future(fut, deadline)
            if not flusher.done():
                raise S.full_error(self.address)
        self._flusher = None
        exc = None if flusher.cancelled() else flusher.exception()
        if exc is not None:
            raise exc

    def _defer_close(self) -> bool:
        flusher = self._flusher
        if flusher is None or flusher.done():
            return False
        # Like zmq's linger: the accepted message gets LINGER seconds to finish, then we cut it.
        self._loop.call_later(S.LINGER, flusher.cancel)
        return True


class UdsAsyncReader(_AsyncBase, AsyncReader):
    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        super().__init__(addr, connect_timeout)
        self._greeted = True
        self._kept = KeptReadable(self._loop)
        # Dropped without close(): unregister before the socket closes (its number is reused).
        self._retire = weakref.finalize(self, self._kept.retire)

    async def recv(self, timeout: float | None = None) -> Message:
        deadline = Deadline(timeout)
        async with self._lock:
            self._check_open()
            await self._ensure_peers(deadline)
            peer = self._peers[0]
            while True:
                msg = await self._read_frame(peer, deadline, wait=self._wait_kept)
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

    async def _wait_kept(self, peer: Peer, deadline: Deadline) -> None:
        kept = self._kept
        fut = kept.wait(peer)
        try:
            await self._wait_future(fut, deadline)
        finally:
            if kept.waiter is fut:
                kept.waiter = None

    def _close_sockets(self) -> None:
        self._retire.detach()
        self._kept.forget()
        super()._close_sockets()


async def _connected(endpoint: _AsyncBase, role: int, rank: int, capacity: int | None) -> None:
    deadline = Deadline(endpoint._connect_timeout)
    sock = await A.connect_async(endpoint._addr, deadline, endpoint._connect_timeout, capacity)
    try:
        await endpoint._loop.sock_sendall(sock, frame_bytes(A.hello(role, rank)))
    except BaseException:
        sock.close()
        raise
    endpoint._peers.append(Peer(sock, rank))


async def open_async_writer(address: str | None, *, bind: bool, capacity: int,
                            connect_timeout: float) -> UdsAsyncWriter:
    check_args(capacity, connect_timeout)
    w = UdsAsyncWriter(A.parse(address, binding=bind), connect_timeout)
    if bind:
        w._bind(AcceptSpec(w.address, A.READER, 1, None, capacity))
    else:
        await _connected(w, A.WRITER, -1, capacity)
    return w


async def open_async_reader(address: str | None, *, bind: bool, capacity: int,
                            connect_timeout: float) -> UdsAsyncReader:
    check_args(capacity, connect_timeout)
    r = UdsAsyncReader(A.parse(address, binding=bind), connect_timeout)
    if bind:
        r._bind(AcceptSpec(r.address, A.WRITER, 1, None))
    else:
        r._greeted = False
        await _connected(r, A.READER, -1, None)
    return r


async def open_async_broadcast_writer(address: str | None, num_readers: int, *, capacity: int,
                                      connect_timeout: float) -> UdsAsyncWriter:
    check_args(capacity, connect_timeout)
    check_num_readers(num_readers)
    w = UdsAsyncWriter(A.parse(address, binding=True), connect_timeout)
    w._bind(AcceptSpec(w.address, A.READER, num_readers, num_readers, capacity))
    return w


async def open_async_broadcast_reader(address: str | None, rank: int, *,
                                      connect_timeout: float) -> UdsAsyncReader:
    check_timeout(connect_timeout, "connect_timeout")
    check_rank(rank)
    r = UdsAsyncReader(A.parse(address, binding=False), connect_timeout)
    r._greeted = False
    await _connected(r, A.READER, rank, None)
    return r
