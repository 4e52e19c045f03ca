"""A wake-up fd for blocking endpoints: ``close()`` from another thread signals it, so a thread
blocked in poll(2) on the endpoint's socket returns at once and raises ``ChannelClosedError``."""

from __future__ import annotations

import os
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
