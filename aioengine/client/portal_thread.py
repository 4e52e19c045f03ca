"""An anyio blocking portal on an event loop (asyncio's, or trio's) in a daemon thread, for the
blocking clients.

Like ``anyio.from_thread.start_blocking_portal``, except for an interrupt (Ctrl-C's
``KeyboardInterrupt``) that lands while the loop is starting: anyio (4.16) then leaves its
``future.result()`` wait and joins a loop thread that nobody stopped, which hangs forever. Here
the loop is stopped as soon as it is up, and the interrupt propagates.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal

START_WAIT = 30.0  # s: a loop that is not up by then was never started


def in_trio_run() -> bool:
    """True on a thread that runs a trio loop (trio is imported only if something has)."""
    trio = sys.modules.get("trio")
    return trio is not None and bool(trio.lowlevel.in_trio_run())


class PortalThread:
    """``portal`` is ready when the constructor returns; ``close()`` stops the loop."""

    def __init__(self, backend_options: dict[str, Any] | None = None,
                 backend: str = "asyncio") -> None:
        started: Future[BlockingPortal] = Future()

        async def serve() -> None:
            async with BlockingPortal() as portal:
                started.set_result(portal)
                await portal.sleep_until_stopped()

        def run() -> None:
            try:
                anyio.run(serve, backend=backend, backend_options=backend_options)
            except BaseException as exc:  # the loop could not start: tell the waiter
                if not started.done():
                    started.set_exception(exc)

        self._thread = threading.Thread(target=run, name="aioengine-portal", daemon=True)
        try:
            self._thread.start()
            self.portal = started.result()
        except BaseException:
            self._stop_when_started(started)
            raise

    def _stop_when_started(self, started: Future[BlockingPortal]) -> None:
        """Interrupted (or failed) while the loop was starting: wait for it to be up (a few
        ms), then stop it. A second interrupt during that wait leaves the daemon thread."""
        try:
            portal = started.result(timeout=START_WAIT)
        except TimeoutError:  # interrupted before the thread was even started
            return
        except Exception:  # it failed to start: nothing runs
            self._thread.join(START_WAIT)
            return
        self.portal = portal
        self.close(cancel_remaining=True)

    def close(self, cancel_remaining: bool = False) -> None:
        """Stop the portal (cancelling tasks still running on it, if asked) and its thread."""
        try:
            self.portal.call(self.portal.stop, cancel_remaining)
        except RuntimeError:  # already stopped (or its loop closed meanwhile)
            if in_trio_run():
                # Never reached: trio refuses blocking calls from a thread that runs a trio
                # loop itself, and joining would wait forever.
                raise
        self._thread.join()
