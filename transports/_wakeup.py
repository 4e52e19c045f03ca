"""A wake-up fd for blocking endpoints: ``close()`` from another thread signals it, so a thread
blocked in poll(2) on the endpoint's socket returns at once and raises ``ChannelClosedError``."""

from __future__ import annotations

import os
import threading
import weakref


class Wakeup:
    """An eventfd (Linux) or a pipe; readable once ``signal()`` was called. The fd is closed only
    when the object is collected, so a poller that raced with ``close()`` never sees a reused
    fd number."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self.fd, self._wfd = fd, fd
            weakref.finalize(self, os.close, fd)
        else:  # pragma: no cover - non-Linux fallback
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self.fd, self._wfd = r, w
            weakref.finalize(self, _close_both, r, w)

    def signal(self) -> None:
        try:
            os.write(self._wfd, (1).to_bytes(8, "little"))
        except (BlockingIOError, OSError):
            pass  # already signalled (counter/pipe full) or being torn down: still readable


def _close_both(r: int, w: int) -> None:  # pragma: no cover - non-Linux fallback
    os.close(r)
    os.close(w)


class BlockingClose:
    """``close()`` of a blocking endpoint, from any thread: wake its waiter (``_wake``), wait
    for the operation in flight to leave (``_lock``), then ``_release`` exactly once."""

    _closing: bool
    _closed: bool
    _wake: Wakeup
    _lock: threading.Lock

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
            self._release()

    def _before_close(self) -> None:
        """What may still finish first (a background flush's linger)."""

    def _release(self) -> None:
        raise NotImplementedError
