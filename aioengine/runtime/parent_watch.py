"""Parent-death watch: every child stops when the process that started it dies.

Two detectors: the kernel's ``PR_SET_PDEATHSIG`` (fast, but it fires when the parent *thread*
exits, so its handler confirms with ``os.getppid()``), and a daemon thread polling
``os.getppid()`` every 0.2 s (the one that always works). Once the parent is gone, shutdown is
requested; if this process has not exited ``exit_deadline`` seconds later (cleanup stuck), it
``os._exit``s -- nobody else is left to kill it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

from aioengine.runtime.procctl import set_parent_death_signal
from aioengine.runtime.shutdown import ShutdownSignal

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.2


def parent_death_signal() -> int:
    """A real-time signal nobody else uses, so the handler can tell it apart from SIGTERM."""
    return signal.SIGRTMIN + 3


def start_parent_watch(parent_pid: int, shutdown: ShutdownSignal, done: threading.Event,
                       *, exit_deadline: float = 1.5, install_signal: bool = True
                       ) -> threading.Thread:
    """Watch ``parent_pid``; ``done`` is set by the busy loop once cleanup has finished."""
    if install_signal:
        signum = parent_death_signal()

        def on_parent_death(_signum: int, _frame: FrameType | None) -> None:
            if os.getppid() != parent_pid:
                shutdown.request(f"parent process {parent_pid} died")

        signal.signal(signum, on_parent_death)
        set_parent_death_signal(signum)
    thread = threading.Thread(target=_watch, args=(parent_pid, shutdown, done, exit_deadline),
                              name="aioengine-parent-watch", daemon=True)
    thread.start()
    return thread


def _watch(parent_pid: int, shutdown: ShutdownSignal, done: threading.Event,
           exit_deadline: float) -> None:
    # Checking before the first sleep also covers a parent that died before we started.
    while os.getppid() == parent_pid:
        if done.wait(POLL_INTERVAL):
            return
    logger.warning("parent process %d died; shutting down", parent_pid)
    shutdown.request(f"parent process {parent_pid} died")
    deadline = time.monotonic() + exit_deadline
    finished = done.wait(exit_deadline)
    # Still alive: either cleanup is stuck or interpreter teardown is; nobody will reap us.
    time.sleep(max(0.0, deadline - time.monotonic()))
    if not finished:
        logger.error("cleanup did not finish within %.1f s of the parent's death; exiting",
                     exit_deadline)
    os._exit(0 if finished else 1)
