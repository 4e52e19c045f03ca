"""Carrying out a ``Wait`` on an asyncio loop, for one async endpoint.

The fds of the ring's own waits (those with ``arm``: the data or space eventfd, the close
eventfd, the peer connections) stay registered with the loop from the first such wait until
``retire()``: adding and removing three fds around every wait cost six epoll_ctl calls and
three handles per streamed message in the host. The core keeps those fds open until it is
released, and ``retire()`` runs before that, so a registered number is never a reused one.
Rendezvous waits (listening and pending sockets, closed by the core once the peers are in) are
registered for that wait only, as before.

A kept fd that fires must not make the level-triggered loop report it again and again:
- an eventfd is read at once. That loses nothing: it only says "look at the ring", whose
  state is in shared memory, and every wait arms (re-checking the ring) before it sleeps. A
  read that finds it empty is a stale report and wakes nobody.
- a socket (the peer's connection: its death, or a stray frame) is taken off the loop and
  reported; the next wait adds it again, and the loop reports it at once if it is still ready.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Generator
from typing import TypeVar

from transports.shm.core import NO_FDS, Core, Wait

T = TypeVar("T")

_EVENTFD, _SOCKET, _ONE_WAIT = 0, 1, 2  # how a registered fd is treated
_TIMER = -1  # the "fd" a deadline reports


def _kind(fd: int) -> int:
    """Eventfds are anonymous inodes (no file type bits); everything else a core waits on is a
    socket."""
    return _SOCKET if stat.S_IFMT(os.fstat(fd).st_mode) else _EVENTFD


class AsyncDriver:
    """Runs an endpoint's operation generators on the running loop. Cancellation closes the
    generator, so the operation undoes whatever it had staged (nothing half-consumed stays)."""

    __slots__ = ("_fds", "_loop", "_waiting")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fds: dict[int, int] = {}  # registered with self._loop -> _EVENTFD/_SOCKET/_ONE_WAIT
        self._waiting: dict[asyncio.Future[None], set[int]] = {}  # each wait's fired fds

    @property
    def registered(self) -> frozenset[int]:
        return frozenset(self._fds)

    async def run(self, gen: Generator[Wait, frozenset[int], T]) -> T:
        try:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # another event loop (trio): anyio waits instead
                from transports.shm import anyio_driver

                return await anyio_driver.run(gen)
            if loop is not self._loop:
                self._move_to(loop)
            wait = next(gen)
            while True:
                wait = gen.send(await self._wait(loop, wait))
        except StopIteration as stop:
            result: T = stop.value
            return result
        finally:
            gen.close()

    def _move_to(self, loop: asyncio.AbstractEventLoop) -> None:
        """A later call on another loop: registrations move there (an endpoint is used from one
        loop at a time; a closed loop took its registrations with it)."""
        self._unregister()
        self._loop = loop

    async def _wait(self, loop: asyncio.AbstractEventLoop, w: Wait) -> frozenset[int]:
        if w.arm is not None and not w.arm():
            return NO_FDS
        fds = self._fds
        once: list[int] = []
        timer = None
        fut = loop.create_future()
        fired: set[int] = set()
        self._waiting[fut] = fired
        try:
            for fd in w.fds:
                if fd not in fds:
                    kind = _ONE_WAIT if w.arm is None else _kind(fd)
                    loop.add_reader(fd, self._on_fd, fd)
                    fds[fd] = kind
                    if kind == _ONE_WAIT:
                        once.append(fd)
            if w.deadline is not None:
                timer = loop.call_later(max(0.0, w.deadline - time.monotonic()), _expire, fut,
                                        fired)
            await fut
        finally:
            del self._waiting[fut]
            if timer is not None:
                timer.cancel()
            for fd in once:
                if fds.pop(fd, None) is not None:  # else retire() took it off already
                    loop.remove_reader(fd)
            if w.disarm is not None:
                w.disarm()
        return frozenset(fired)

    def _on_fd(self, fd: int) -> None:
        kind = self._fds.get(fd)
        if kind == _EVENTFD:
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                return  # drained since the loop looked (a waiter's disarm): nothing new
        elif kind == _SOCKET:
            del self._fds[fd]
            assert self._loop is not None
            self._loop.remove_reader(fd)
        for fut, fired in self._waiting.items():
            if not fut.done():
                fired.add(fd)
                fut.set_result(None)

    def _unregister(self) -> None:
        """Take every fd off the loop (a loop that is closed has forgotten them already)."""
        loop = self._loop
        if self._fds and loop is not None and not loop.is_closed():
            for fd in self._fds:
                loop.remove_reader(fd)
        self._fds.clear()

    def retire(self, core: Core) -> None:
        """Unregister, wake any wait (it finds the core closed), then close the core, which
        closes the fds once no operation is in flight. From the loop's own thread, or with the
        loop not running anywhere, at once; from another thread (a dropped endpoint collected
        there) the loop's thread does it: the selector is not thread-safe."""
        loop = self._loop
        if loop is not None and loop.is_running() and not _in_thread_of(loop):
            try:
                loop.call_soon_threadsafe(self._retire_here, core)
                return
            except RuntimeError:  # the loop closed in between: nothing is registered now
                pass
        self._retire_here(core)

    def _retire_here(self, core: Core) -> None:
        self._unregister()
        for fut in self._waiting:
            if not fut.done():
                fut.set_result(None)
        core.close()


def _expire(fut: asyncio.Future[None], fired: set[int]) -> None:
    if not fut.done():
        fired.add(_TIMER)
        fut.set_result(None)


def _in_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
