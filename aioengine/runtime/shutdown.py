"""ShutdownSignal: the one flag a child's busy loop and its target watch.

``request()`` is async-signal-safe (a plain attribute write and a non-blocking ``os.write``), so
signal handlers call it directly. A dispatcher thread then sets the ``threading.Event``, makes
``fileno()`` readable, and runs the wake-up callbacks -- off the signal handler, so a callback may
close an endpoint that the main thread is blocked on (endpoints wake waiters on close).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class ShutdownSignal:
    def __init__(self) -> None:
        self._requested = False
        self._reason: str | None = None
        self._event = threading.Event()
        self._lock = threading.Lock()  # never taken in request(): signal handlers call it
        self._callbacks: list[Callable[[], None]] = []
        self._dispatched = False
        self._trigger_r, self._trigger_w = os.pipe()
        self._notify_r, self._notify_w = os.pipe()
        os.set_blocking(self._trigger_w, False)
        self._thread = threading.Thread(target=self._dispatch, name="aioengine-shutdown",
                                        daemon=True)
        self._thread.start()

    @property
    def requested(self) -> bool:
        return self._requested

    @property
    def reason(self) -> str | None:
        return self._reason

    def request(self, reason: str) -> None:
        """Ask the loop to stop at the next step boundary. The first reason wins."""
        if self._requested:
            return
        self._reason = reason
        self._requested = True
        try:
            os.write(self._trigger_w, b"x")
        except (BlockingIOError, OSError):
            pass  # already triggered (pipe full) or closing

    def wait(self, timeout: float | None = None) -> bool:
        """Block until shutdown is requested (True) or ``timeout`` passes (False)."""
        return self._event.wait(timeout)

    def fileno(self) -> int:
        """An fd that turns readable once shutdown is requested (for select/epoll waits)."""
        return self._notify_r

    def add_wakeup(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once when shutdown is requested, from the dispatcher thread (or right
        now, in this thread, if it already was). Use it to wake a blocking wait, e.g. by closing
        the endpoint a target is blocked on in ``recv``."""
        with self._lock:
            if not self._dispatched:
                self._callbacks.append(callback)
                return
        _run(callback)

    def close(self) -> None:
        """Stop the dispatcher thread and release the fds (requests shutdown if not yet)."""
        self.request("closed")
        self._thread.join()
        for fd in (self._trigger_r, self._trigger_w, self._notify_r, self._notify_w):
            os.close(fd)

    def _dispatch(self) -> None:
        os.read(self._trigger_r, 1)  # retried on EINTR by Python
        logger.debug("shutdown requested: %s", self._reason)
        with self._lock:  # before the event: a callback added after wait() runs at once
            self._dispatched = True
            callbacks, self._callbacks = self._callbacks, []
        self._event.set()
        os.write(self._notify_w, b"x")
        for callback in callbacks:
            _run(callback)


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        logger.exception("shutdown wake-up callback %r failed", callback)
