"""What every shm endpoint shares, sync or async: lifecycle (open, close, release), the
rendezvous deadline, and the description of a wait that the sync/async drivers carry out.

Operations are generators that yield ``Wait`` objects whenever they cannot proceed; the sync
driver spins and then polls, the async driver awaits the event loop. So the protocol logic is
written once and only the waiting differs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from transports.errors import ChannelClosedError, TransportError
from transports.shm.address import url
from transports.shm.ordering import make_fence

log = logging.getLogger(__name__)

NO_FDS: frozenset[int] = frozenset()


@dataclass(slots=True)
class Wait:
    """Sleep until one of ``fds`` is readable or ``deadline`` (monotonic) passes. ``ready`` is a
    cheap check worth spinning on first; ``arm`` announces the sleep in shared memory and
    returns False if progress became possible meanwhile; ``disarm`` withdraws it."""

    fds: tuple[int, ...]
    deadline: float | None
    ready: Callable[[], bool] | None = None
    arm: Callable[[], bool] | None = None
    disarm: Callable[[], None] | None = None


def new_eventfd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def drain(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


class Core:
    """Owns fds and sockets and releases them exactly once: at ``close()``, or when the last
    operation in flight (another thread, or a suspended coroutine) leaves after it."""

    def __init__(self, name: str, connect_timeout: float) -> None:
        self.name = name
        self.url = url(name)
        self.connect_timeout = connect_timeout
        self._rdv_end: float | None = None
        self._fence = make_fence()
        self._lock = threading.Lock()
        self.closed = False
        self.fast = False  # ready, open and not broken: the endpoints' hot paths may run
        self._released = False
        self.ops = 0  # operations in flight; the last one out after close() releases
        self._broken: TransportError | None = None  # sticky failure, re-raised by every op
        self._fds: list[int] = []
        self._socks: list[socket.socket] = []
        self.close_efd = new_eventfd()
        self._fds.append(self.close_efd)

    # ---- operations --------------------------------------------------------------------------
    # An endpoint method does ``ops += 1`` first, then reads ``closed``/``fast``; close() sets
    # them first, then reads ``ops``. Under the GIL one of the two sees the other, so the fds
    # are released exactly when no operation is using them.
    def after_op(self) -> None:
        """Call in ``finally`` after ``ops += 1``."""
        self.ops -= 1
        if self.closed and self.ops == 0:
            self._release()

    def check_usable(self) -> None:
        if self.closed:
            raise ChannelClosedError(f"endpoint {self.url} is closed")
        if self._broken is not None:
            raise type(self._broken)(str(self._broken))

    def check_open(self) -> None:
        if self.closed:
            raise ChannelClosedError(f"endpoint {self.url} was closed")

    def fail(self, err: TransportError) -> TransportError:
        """Remember ``err`` so later operations raise it too; return it for ``raise``."""
        self._broken = err
        self.fast = False
        return err

    def rendezvous_end(self) -> float:
        """When a binder stops waiting for its peers: connect_timeout after its first wait."""
        if self._rdv_end is None:
            self._rdv_end = time.monotonic() + self.connect_timeout
        return self._rdv_end

    def adopt(self, sock: socket.socket) -> None:
        """Take over a connecting side's connection to the binder; subclasses override."""
        raise NotImplementedError

    def own_socket(self, sock: socket.socket) -> socket.socket:
        self._socks.append(sock)
        return sock

    def drop_socket(self, sock: socket.socket) -> None:
        if sock in self._socks:
            self._socks.remove(sock)
        sock.close()

    # ---- closing -----------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.fast = False
        try:
            self._announce_close()
        finally:
            os.eventfd_write(self.close_efd, 1)  # wakes a waiter in another thread / the loop
            if self.ops == 0:
                self._release()

    def _release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            self._free()
        finally:
            for sock in self._socks:
                sock.close()
            for fd in self._fds:
                os.close(fd)
            self._socks, self._fds = [], []

    def _announce_close(self) -> None:
        """Tell the peer(s) through shared memory; subclasses override."""

    def _free(self) -> None:
        """Unmap; subclasses override."""

    def __del__(self) -> None:
        if getattr(self, "_fds", None):
            try:
                self.close()
            except Exception:  # never raise from a finalizer
                log.debug("error closing %s at collection", getattr(self, "url", "?"),
                          exc_info=True)
