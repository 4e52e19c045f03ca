"""asyncio zmq endpoints, a thin driver of ``core``'s operations: the zmq notification fds (data
and monitor socket) are registered with the event loop; after every wake-up ``ZMQ_EVENTS`` is
re-read, which both answers the question and re-arms zmq's edge-triggered fd. Messages are taken
only synchronously, so a cancelled ``recv`` never loses one.

The fds stay registered from the first wait until close (adding and removing them around every
wait cost four epoll_ctl calls and two handles per streamed message in the host). A wake-up
nobody waits for reads ``ZMQ_EVENTS`` to re-arm the fd, so the loop does not report it again
and again; the state it answered is read again by whatever operation comes next, before it
waits. The loop holds the endpoint only weakly, and a dropped endpoint's finalizer unregisters
the fds before closing the sockets (their numbers may be reused)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Generator, Sequence
from typing import TypeVar

import anyio

from transports._buffers import message_views
from transports._deadline import Deadline
from transports.base import AsyncReader, AsyncWriter, Buffer, Endpoint, Message
from transports.errors import ChannelClosedError
from transports.zmq import channel as C
from transports.zmq import core as K
from transports.zmq.core import Wait

T = TypeVar("T")
AsyncLock = asyncio.Lock | anyio.Lock


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _on_fd(ref: weakref.ref[_AsyncBase]) -> None:
    endpoint = ref()
    if endpoint is not None:
        endpoint._fd_ready()


def _finalize(loop: asyncio.AbstractEventLoop, fds: list[int], registered: list[bool],
              ch: C.Channel) -> None:
    """A dropped endpoint: unregister its fds from the loop, then close without linger. The
    selector belongs to the loop's thread: from any other thread the whole job goes there."""
    if not registered[0] or loop.is_closed():
        ch.close(0)
        return
    try:
        here = asyncio.get_running_loop() is loop
    except RuntimeError:
        here = False
    if not here:
        try:
            loop.call_soon_threadsafe(_finalize_here, loop, fds, ch)
            return
        except RuntimeError:  # closed in between
            ch.close(0)
            return
    _finalize_here(loop, fds, ch)


def _finalize_here(loop: asyncio.AbstractEventLoop, fds: list[int], ch: C.Channel) -> None:
    if not loop.is_closed():
        for fd in fds:
            loop.remove_reader(fd)
    ch.close(0)


class _AsyncBase(Endpoint):
    _writer = False

    def __init__(self, plan: K.Plan, connect_timeout: float) -> None:
        self._core = K.ZmqCore.open(self, plan, connect_timeout)
        self._ch = ch = self._core.ch
        self._fds = [ch.sock.FD] + ([ch.mon.FD] if ch.mon is not None else [])
        self._closed = False
        self._attach(ch)

    def _attach(self, ch: C.Channel) -> None:
        """The driver's own state (the anyio driver overrides this, ``_wait``, ``_sleep`` and
        ``close``; the operations themselves are shared)."""
        self._loop = asyncio.get_running_loop()
        self._lock: AsyncLock = asyncio.Lock()
        self._waiters: set[asyncio.Future[None]] = set()
        self._fd_waiters: set[asyncio.Future[None]] = set()
        self._registered = [False]  # shared with the finalizer
        weakref.finalize(self, _finalize, self._loop, self._fds, self._registered, ch)

    @property
    def address(self) -> str:
        return self._ch.url

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"endpoint {self.address} is closed")

    async def _wait(self, deadline: Deadline) -> None:
        """Until either zmq fd signals, the deadline, or close() (ChannelClosedError)."""
        if not self._registered[0]:
            ref = weakref.ref(self)
            for fd in self._fds:
                self._loop.add_reader(fd, _on_fd, ref)
            self._registered[0] = True
        fut: asyncio.Future[None] = self._loop.create_future()
        left = deadline.remaining()
        timer = None if left is None else self._loop.call_later(left, _wake, fut)
        self._waiters.add(fut)
        self._fd_waiters.add(fut)
        try:
            await fut
        finally:
            self._waiters.discard(fut)
            self._fd_waiters.discard(fut)
            if timer is not None:
                timer.cancel()
        # Woken, then closed before we ran again: close() found ``fut`` already done.
        if self._closed:
            raise ChannelClosedError(f"endpoint {self.address} was closed")

    def _fd_ready(self) -> None:
        woke = False
        for fut in self._fd_waiters:
            if not fut.done():
                fut.set_result(None)
                woke = True
        if not woke and not self._closed:
            # Re-arm the fds (see the module doc); the answer is read again before any wait.
            self._ch.has(0)
            self._ch.mon_has_events()

    async def _run(self, gen: Generator[Wait, None, T]) -> T:
        """Drive one core operation: wait on the registered fds whenever it yields (unless
        news is already pending: the fds are edge-triggered)."""
        core = self._core
        try:
            w = next(gen)
            while True:
                if not w.settle or core.settled(w.settle):
                    await self._wait(w.deadline)
                w = next(gen)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._registered[0]:
            self._registered[0] = False
            for fd in self._fds:
                self._loop.remove_reader(fd)
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_exception(ChannelClosedError(f"endpoint {self.address} was closed"))
        ch = self._ch
        ch.close(ch.closing_linger(self._writer), background=True)


class ZmqAsyncWriter(_AsyncBase, AsyncWriter):
    _writer = True

    async def send(self, header: Buffer, buffers: Sequence[Buffer] = (),
                   timeout: float | None = None) -> None:
        deadline = Deadline(timeout)
        head, bufs = message_views(header, buffers)
        frames = [head, *bufs]
        async with self._lock:
            self._check_open()
            ch = self._ch
            # Ready and room: the common case sends without making a generator.
            trackers = ch.send_step(frames) if ch.ready else None
            if trackers is None:
                trackers = await self._run(self._core.send(frames, deadline))
            # zmq reads writable caller buffers later; complete once it is done with them.
            for tracker in trackers:
                pause = 0.0005
                while not tracker.done:
                    await self._sleep(pause)
                    pause = min(pause * 2, 0.01)

    async def _sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        timer = self._loop.call_later(seconds, _wake, fut)
        self._waiters.add(fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiters.discard(fut)


class ZmqAsyncReader(_AsyncBase, AsyncReader):
    async def recv(self, timeout: float | None = None) -> Message:
        deadline = Deadline(timeout)
        async with self._lock:
            self._check_open()
            msg = self._ch.try_recv()
            if msg is not None:
                return msg
            return await self._run(self._core.recv(deadline, timeout))
