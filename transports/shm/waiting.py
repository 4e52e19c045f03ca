"""Carrying out a ``Wait``: blocking (short adaptive spin, then poll(2)) or on an asyncio loop
(``add_reader`` on the eventfds and sockets, see ``aio_driver``). The generators in the cores
decide *what* to wait for; these drivers only decide *how*."""

from __future__ import annotations

import math
import select
import time
from collections.abc import Callable, Generator
from typing import TypeVar

from transports.shm.core import NO_FDS, Wait

T = TypeVar("T")

# Why these numbers: a blocking wait that sleeps pays the peer's eventfd write, the scheduler's
# hand-over and, on a VM whose idle vCPUs halt, the hypervisor waking our vCPU: from ~10 us on
# a busy core to ~100 us on a quiet Firecracker guest. Worse, in a ping-pong a sleeper leaves
# its peer nothing to catch: the peer's spin fails too, and both sides then sleep on every
# message (each spin times out because the other side is itself asleep). So the budget is
# learned from the sleeps themselves: a sleep of T that ended with progress would have been
# caught by a spin of ~2T (the ski-rental argument: never more than about twice the better
# choice made in hindsight). SPIN_MAX_NS bounds it: a peer slower than that is not spun for.
SPIN_MAX_NS = 250_000
SPIN_START_NS = 20_000
SPIN_MIN_NS = 500  # a budget halved below this is 0: not worth the clock reads
PROBE_EVERY = 32  # while spins keep failing, still try one learned-length spin this often


class Spinner:
    """Adaptive spin budget for one endpoint.

    A spin that finds progress keeps its budget; one that fails halves it. After a real sleep
    of T ns that was short (spinning for 2T would have caught it) the budget grows back to
    ~2T (remembered as ``learned``) -- but halved once more for every spin that failed in a
    row, because spins that keep failing while the peer answers quickly mean the peer shares
    our core (it cannot run while we spin). Every PROBE_EVERY-th wait still spins for the
    learned length, and one that succeeds restores that budget, so spinning resumes once the
    peer runs elsewhere again. An idle or slow peer drives the budget to 0: no CPU burned.

    The spin never calls sched_yield(): on a busy machine a yield hands the core to whatever
    the scheduler likes best, often a CPU-bound task for a whole time slice (milliseconds of
    latency), and each yield is a syscall. Sleeping on the eventfd instead lets the kernel
    hand the core straight to the woken peer.
    """

    __slots__ = ("budget", "learned", "misses", "waits")

    def __init__(self) -> None:
        self.budget = SPIN_START_NS
        self.learned = SPIN_START_NS  # the spin that would have caught the last short sleep
        self.misses = 0  # spins that failed in a row
        self.waits = 0

    def spin(self, ready: Callable[[], bool]) -> bool:
        """Busy-wait up to the budget for ``ready()``; False if the caller must sleep."""
        budget = kept = self.budget
        if self.misses or not budget:
            self.waits += 1
            if self.waits % PROBE_EVERY == 0:
                budget = self.learned  # probe: does spinning pay again?
            if budget <= 0:
                return False
        now = time.monotonic_ns
        end = now() + budget
        while not ready():
            if now() >= end:
                self.budget = kept // 2 if kept >= 2 * SPIN_MIN_NS else 0
                self.misses += 1
                return False
        self.budget = budget  # a successful probe restores the learned budget
        self.misses = 0
        return True

    def slept(self, ns: int) -> None:
        """A sleep of ``ns`` ended with progress: a spin of ~2x that would have caught it."""
        if ns < SPIN_MAX_NS:
            self.learned = learned = min(SPIN_MAX_NS, 2 * ns)
            grown = learned >> min(self.misses, 16)
            self.budget = max(self.budget, grown if grown >= SPIN_MIN_NS else 0)


class SyncDriver:
    """Runs an operation generator to completion, blocking the calling thread."""

    def __init__(self) -> None:
        self.spinner = Spinner()
        self._poll_fds: tuple[int, ...] = ()
        self._poller = select.poll()

    def run(self, gen: Generator[Wait, frozenset[int], T], spun: bool = False) -> T:
        """``spun``: the caller has just spun for the first wait's condition; do not again."""
        try:
            wait = next(gen)
            if spun:
                wait = gen.send(self._sleep(wait))
            while True:
                wait = gen.send(self._wait(wait))
        except StopIteration as stop:
            result: T = stop.value
            return result
        finally:
            gen.close()

    def _wait(self, w: Wait) -> frozenset[int]:
        if w.ready is not None and self.spinner.spin(w.ready):
            return NO_FDS
        return self._sleep(w)

    def _sleep(self, w: Wait) -> frozenset[int]:
        if w.arm is not None and not w.arm():
            return NO_FDS
        if w.fds != self._poll_fds:
            self._poller = select.poll()
            for fd in w.fds:
                self._poller.register(fd, select.POLLIN)
            self._poll_fds = w.fds
        ms = -1 if w.deadline is None else max(0, math.ceil((w.deadline - time.monotonic())
                                                            * 1000))
        start = time.monotonic_ns()
        try:
            events = self._poller.poll(ms)
        finally:
            if w.disarm is not None:
                w.disarm()
        if w.ready is not None and events:
            self.spinner.slept(time.monotonic_ns() - start)
        return frozenset(fd for fd, _ in events)
