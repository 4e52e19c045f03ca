"""Where and when the engine process's I/O threads run, so they cost the model as little as can be.

With the model computing on the CPU in the engine's own loop thread (uniproc), every Python
instruction an I/O thread runs holds the GIL that the model thread takes back after each torch op.
Left to the OS, the output thread woke on another CPU once per token, took the GIL while the model
was inside an op, and the model, coming back, fell asleep waiting for it: about one sleep per token,
each a futex wake-up across vCPUs (docs/benchmarks.md). ``ModelCpuFollower`` keeps the I/O threads
on the CPU the loop runs on and hands them that CPU at the end of each step that queued output: they
then run only while the loop is not computing, so nobody waits for the GIL (almost no sleeps) and no
wake-up crosses CPUs. Their work is serialised with the model's either way (one GIL); what goes away
is the waiting. The loop is never pinned: the threads follow it when the OS moves it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)

HAND_OVER_WAIT = 0.002  # s the loop waits for its frame to be sent (far longer than a send takes)


def yield_to_model() -> None:
    """Put the calling thread under ``SCHED_BATCH``: same CPU share, but its wake-ups never
    preempt the thread running on the CPU it lands on (the model's), they wait for a tick or for
    that thread to give the CPU up. Where that is not available (not Linux, a sandbox that
    forbids it) the thread just keeps the default policy."""
    setter = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if setter is None or batch is None:
        return
    try:
        setter(0, batch, os.sched_param(0))  # 0: the calling thread, on Linux
    except OSError as exc:
        logger.debug("SCHED_BATCH not available for %s: %s",
                     threading.current_thread().name, exc)


class ModelCpuFollower:
    """Keeps ``threads`` on the loop thread's CPU; the loop calls ``hand_over`` after queueing
    output. Disabled (every call a no-op) where the OS cannot do it: not Linux, no
    ``sched_getcpu``, or affinity refused (a sandbox, a cpuset that shrank)."""

    def __init__(self, threads: Sequence[threading.Thread]) -> None:
        self._threads = [t for t in threads if t.native_id is not None]
        self._getcpu = _sched_getcpu()
        self._cpu = -1
        self._sent: queue.SimpleQueue[None] = queue.SimpleQueue()  # one per frame sent
        self._behind = False  # the last wait timed out and nothing was sent since
        self.active = self._getcpu is not None and hasattr(os, "sched_setaffinity")
        if self.active:
            self._follow()

    def expect(self) -> None:
        """Called by the loop thread before it queues a frame: forget the acknowledgements of
        frames it stopped waiting for -- unless the output thread has sent nothing since the
        last wait timed out (it is stuck behind a slow reader): then the loop does not wait."""
        sent = self._sent
        if self._behind:
            if sent.empty():
                return
            self._behind = False
        while not sent.empty():
            sent.get_nowait()

    def hand_over(self) -> None:
        """Called by the loop thread after queueing a frame: move the I/O threads to this CPU
        if the loop has moved, then give them the CPU until the frame is sent (they are
        ``SCHED_BATCH``: without this they would wait for the next scheduler tick,
        milliseconds, before sending the step's output). The loop blocks for it rather than
        calling ``sched_yield``, which on a busy machine hands the CPU to another process for
        a whole time slice (0.91x of the option off with a CPU hog on each core, against
        0.97x for this wait). It waits ``HAND_OVER_WAIT`` at most, and not at all while the
        output thread is behind (see ``expect``): a slow reader never slows the loop down."""
        if not self.active:
            return
        self._follow()
        if self._behind:
            return
        try:
            self._sent.get(timeout=HAND_OVER_WAIT)
        except queue.Empty:
            self._behind = True

    def sent(self) -> None:
        """Called by the output thread after each frame it sent."""
        self._sent.put(None)

    def _follow(self) -> None:
        cpu = self._getcpu()  # type: ignore[misc]
        if cpu == self._cpu:
            return
        if cpu < 0:
            self._release(OSError("sched_getcpu failed"))
            return
        for tid in self._live_tids():
            try:
                os.sched_setaffinity(tid, (cpu,))
            except ProcessLookupError:  # a thread that already ended (shutdown): nothing to move
                continue
            except OSError as exc:
                self._release(exc)
                return
        self._cpu = cpu

    def _release(self, exc: OSError) -> None:
        """Give up following: let the threads run anywhere this process may."""
        self.active = False
        logger.debug("I/O threads cannot follow the model's CPU: %s", exc)
        allowed = os.sched_getaffinity(0)
        for tid in self._live_tids():
            try:
                os.sched_setaffinity(tid, allowed)
            except OSError:
                pass

    def _live_tids(self) -> list[int]:
        """The ids of the threads still running: an ended thread's id is free for the kernel
        to give to a new thread or process (of this user, maybe not of this process), which
        must not be pinned in its place."""
        self._threads = [t for t in self._threads if t.is_alive()]
        return [t.native_id for t in self._threads]  # type: ignore[misc]


def _sched_getcpu() -> Callable[[], int] | None:
    """libc's ``sched_getcpu`` (a vDSO read, well under a microsecond), called with the GIL held
    (``PyDLL``): releasing it for so short a call would cost more than the call."""
    try:
        fn = ctypes.PyDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn if fn() >= 0 else None
