"""The async reader's connection, kept registered with the loop from its first wait until
close (adding and removing it around every wait cost two epoll_ctl calls and a handle per
streamed message in the host).

A report with a ``recv`` waiting reads what the socket holds into the frame reader's buffer
(the read the woken ``recv`` would do first), so the socket is no longer ready when the loop
next looks: a level-triggered report is not repeated, and a report that finds nothing to read
(the waiter read it already) wakes nobody, and one while the woken ``recv`` has not run yet is
left to it. A report nobody waits for (after a peek shows it is not a stale one: the last
``recv`` may have read the bytes after the loop looked) takes the socket off the loop instead of
reading (reading would buffer without bound: no backpressure); the next wait
adds it back, and the loop reports it at once if it is still ready. So nothing is lost, and
the loop does not spin.

The loop's handle holds this object, never the endpoint: a dropped endpoint is collected, and
its finalizer (``retire``) unregisters the socket before closing it (its number gets reused).
"""

from __future__ import annotations

import asyncio
import socket

from transports.uds import stream as S
from transports.uds.peers import Peer


class KeptReadable:
    __slots__ = ("_fd", "_loop", "_peer", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._peer: Peer | None = None  # registered with the loop while set
        self._fd = -1
        self.waiter: asyncio.Future[None] | None = None

    def wait(self, peer: Peer) -> asyncio.Future[None]:
        """A future the next report on ``peer``'s socket completes (after reading it)."""
        if self._peer is not peer:
            self.forget()
            self._fd = peer.sock.fileno()
            self._loop.add_reader(self._fd, self._on_readable)
            self._peer = peer
        fut = self.waiter = self._loop.create_future()
        return fut

    def _on_readable(self) -> None:
        peer, fut = self._peer, self.waiter
        assert peer is not None
        if fut is None:
            try:
                peer.sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                return  # a stale report: the last recv read everything after the loop looked
            except OSError:
                pass
            self.forget()
            return
        if fut.done():
            return  # woken, not resumed yet: it reads the socket itself when it runs (next pass)
        try:
            n = peer.sock.recv_into(peer.reader.read_target())
        except BlockingIOError:
            return  # the waiter read it since the loop looked: nothing new
        except OSError as e:
            if e.errno not in S.GONE:
                fut.set_result(None)  # the woken read_step meets the error and raises it
                return
            n = 0
        if n == 0:
            peer.eof = True
        else:
            peer.reader.commit(n)
        fut.set_result(None)

    def forget(self) -> None:
        """Take the socket off the loop (before it is closed, and from the loop's thread)."""
        if self._peer is not None:
            self._peer = None
            if not self._loop.is_closed():
                self._loop.remove_reader(self._fd)

    def retire(self) -> None:
        """The endpoint was collected without close(): unregister, then close the socket. The
        selector belongs to the loop's thread: from another thread the job goes there."""
        peer = self._peer
        if peer is None:
            return
        loop = self._loop
        if loop.is_running() and not _in_thread_of(loop):
            try:
                loop.call_soon_threadsafe(self._retire_here, peer)
                return
            except RuntimeError:  # the loop closed in between: nothing is registered now
                pass
        self._retire_here(peer)

    def _retire_here(self, peer: Peer) -> None:
        self.forget()
        peer.sock.close()


def _in_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
