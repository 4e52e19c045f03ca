"""asyncio uds endpoints, a thin driver of ``core``'s operations: non-blocking sockets waited
on with ``loop.add_reader``/``add_writer``. A binder accepts its peers in a background task, so
connectors never wait for its first operation; a frame whose ``send`` gave up half-written
(timeout or cancellation) is finished by a background task.

Bytes move only in synchronous steps between awaits (into the frame reader's buffer), so a
cancelled ``recv`` loses nothing: the next one finds the data where the last one left it. The
reader's connection stays registered from its first wait until close (``aio_kept``).

``open_async_*`` build the anyio driver's endpoints instead when no asyncio loop runs (trio).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Generator, Sequence
from typing import TypeVar

import anyio

from transports._buffers import message_views
from transports._deadline import Deadline
from transports.base import AsyncReader, AsyncWriter, Buffer, Endpoint, Message
from transports.errors import ChannelClosedError
from transports.uds import address as A
from transports.uds import core as K
from transports.uds import stream as S
from transports.uds.aio_kept import KeptReadable
from transports.uds.framing import frame_parts
from transports.uds.outbound import Outbound
from transports.uds.peers import Peer

T = TypeVar("T")
AsyncLock = asyncio.Lock | anyio.Lock


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _AsyncBase(Endpoint):
    def __init__(self, addr: A.UdsAddress, connect_timeout: float) -> None:
        self._core = K.UdsCore(addr, connect_timeout)
        self._peers = self._core.peers
        self._closed = False
        self._attach()

    def _attach(self) -> None:
        """The driver's own state (the anyio driver overrides this, the waiting, the
        background work and ``close``; the operations are shared)."""
        self._loop = asyncio.get_running_loop()
        self._lock: AsyncLock = asyncio.Lock()
        self._waiters: set[asyncio.Future[None]] = set()
        self._accept_task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return self._core.url

    def _check_open(self) -> None:
        self._core.check_usable(self._closed)

    async def _run(self, gen: Generator[K.Wait, None, T]) -> T:
        """Drive one core operation, waiting on the loop whenever it yields."""
        try:
            w = next(gen)
            while True:
                await self._wait(w)
                w = next(gen)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    # ---- binding side: a background task accepts, so connectors never wait for our first op --
    def _accept_in_background(self) -> None:
        task = self._loop.create_task(self._run(self._core.accept_all(Deadline(None))))
        task.add_done_callback(_retrieve)
        self._accept_task = task

    async def _ensure_peers(self, deadline: Deadline) -> None:
        task = self._accept_task
        if task is None:
            return
        core = self._core
        if not task.done():
            if core.connect_deadline is None:
                core.connect_deadline = Deadline(core.connect_timeout)
            wait = Deadline.earliest(deadline, core.connect_deadline)
            fut: asyncio.Future[None] = self._loop.create_future()
            task.add_done_callback(lambda _t: _wake(fut))
            await self._wait_future(fut, wait)
            if not task.done():
                raise core.accept_timeout()
        if task.cancelled():
            raise ChannelClosedError(f"endpoint {self.address} is closed")
        exc = task.exception()
        if exc is not None:
            raise exc
        self._accept_task = None

    # ---- waiting -----------------------------------------------------------------------------
    async def _wait(self, w: K.Wait) -> None:
        await self._wait_fds(w.fds, w.writable, w.deadline, w.closable)

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
        core = self._core
        for peer in core.peers:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(peer.sock.fileno())
                self._loop.remove_writer(peer.sock.fileno())
        if core.listener is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(core.listener.fileno())
        core.close_sockets()


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved; ops re-raise it


class UdsAsyncWriter(_AsyncBase, AsyncWriter):
    def _attach(self) -> None:
        super()._attach()
        self._flusher: asyncio.Task[None] | None = None

    async def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
                   timeout: float | None = None) -> None:
        deadline = Deadline(timeout)
        parts = frame_parts(*message_views(header, buffers))
        async with self._lock:
            self._check_open()
            await self._ensure_peers(deadline)
            await self._join_flusher(deadline)
            outs = [(p, Outbound(parts)) for p in self._core.peers]
            pending = self._core.write_now(outs)  # most frames go out in this one pass
            if not pending:
                return
            gen = self._core.write(outs, deadline, stash=True, pending=pending)
            try:
                rest = await self._run(gen)
            except anyio.get_cancelled_exc_class():
                # Cancelled mid-frame: it must complete or the stream breaks (from a copy).
                rest = self._core.unsent
                if rest and any(out.started for _, out in outs) and not self._closed:
                    self._start_flusher(rest)
                raise
            if rest:
                self._start_flusher(rest)  # the next send waits for it

    def _start_flusher(self, pending: S.Pending) -> None:
        for _, out in pending:
            out.detach()
        self._flusher = self._loop.create_task(self._flush(pending))
        self._flusher.add_done_callback(_retrieve)

    async def _flush(self, pending: S.Pending) -> None:
        try:
            # Not interrupted by close() (Wait.closable): bounded by LINGER instead.
            await self._run(self._core.write(pending, Deadline(None), stash=False))
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
    def _attach(self) -> None:
        super()._attach()
        self._kept = KeptReadable(self._loop)
        # Dropped without close(): unregister before the socket closes (its number is reused).
        self._retire = weakref.finalize(self, self._kept.retire)

    async def recv(self, timeout: float | None = None) -> Message:
        deadline = Deadline(timeout)
        async with self._lock:
            self._check_open()
            core = self._core
            msg = core.recv_now()
            if msg is not None:
                return msg
            # ``waited``: recv_now read the socket and found no whole frame. Not so while the
            # peers come (accepting them can read a hello and the first frame together) or the
            # greeting is due: then the core reads before it waits.
            waited = core.streaming
            if waited:  # the common wait, before any generator
                await self._wait_data(core.peers[0], deadline)
                msg = core.recv_now()
                if msg is not None:
                    return msg
            else:
                await self._ensure_peers(deadline)
            return await self._run(core.recv(deadline, timeout, waited))

    async def _wait(self, w: K.Wait) -> None:
        if w.kept is None:
            await self._wait_fds(w.fds, w.writable, w.deadline, w.closable)
        else:
            await self._wait_data(w.kept, w.deadline)

    async def _wait_data(self, peer: Peer, deadline: Deadline) -> None:
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
