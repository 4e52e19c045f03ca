"""Carrying out a ``Wait``: blocking (short adaptive spin, then poll(2)) or on an asyncio loop
(``add_reader`` on the eventfds and sockets). The generators in the cores decide *what* to
wait for; these drivers only decide *how*."""

from __future__ import annotations

import asyncio
import math
import os
import select
import time
from collections.abc import Callable, Generator
from typing import TypeVar

from transports.shm.core import NO_FDS, Wait

T = TypeVar("T")

SPIN_MAX_NS = 100_000  # never spin longer than this per wait (an idle reader stays ~0% CPU)
SPIN_START_NS = 20_000


class Spinner:
    """Adaptive spin budget. A spin that finds progress keeps its budget; one that fails
    halves it. After a real sleep of T ns the budget becomes ~2T if T was short (spinning would
    have caught it), so a fast ping-pong spins and an idle or slow peer costs nothing."""

    __slots__ = ("budget",)

    def __init__(self) -> None:
        self.budget = SPIN_START_NS

    def spin(self, ready: Callable[[], bool]) -> bool:
        budget = self.budget
        if budget <= 0:
            return False
        now, pause = time.monotonic_ns, os.sched_yield
        end = now() + budget
        while not ready():
            if now() >= end:
                self.budget = budget // 2 if budget > 500 else 0
                return False
            pause()  # on a busy box, lend the CPU (the peer may need it to make progress)
        return True

    def slept(self, ns: int) -> None:
        if ns < SPIN_MAX_NS // 2:
            self.budget = min(SPIN_MAX_NS, max(self.budget, 2 * ns))


class SyncDriver:
    """Runs an operation generator to completion, blocking the calling thread."""

    def __init__(self) -> None:
        self.spinner = Spinner()
        self._poll_fds: tuple[int, ...] = ()
        self._poller = select.poll()

    def run(self, gen: Generator[Wait, frozenset[int], T]) -> T:
        try:
            wait = next(gen)
            while True:
                wait = gen.send(self._wait(wait))
        except StopIteration as stop:
            return stop.value
        finally:
            gen.close()

    def _wait(self, w: Wait) -> frozenset[int]:
        if w.ready is not None and self.spinner.spin(w.ready):
            return NO_FDS
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
        if w.ready is not None:
            self.spinner.slept(time.monotonic_ns() - start)
        return frozenset(fd for fd, _ in events)


async def run_async(gen: Generator[Wait, frozenset[int], T]) -> T:
    """Runs an operation generator on the running loop. Cancellation closes the generator, so
    the operation undoes whatever it had staged (nothing half-consumed stays behind)."""
    loop = asyncio.get_running_loop()
    try:
        wait = next(gen)
        while True:
            wait = gen.send(await _wait_async(loop, wait))
    except StopIteration as stop:
        return stop.value
    finally:
        gen.close()


async def _wait_async(loop: asyncio.AbstractEventLoop, w: Wait) -> frozenset[int]:
    if w.arm is not None and not w.arm():
        return NO_FDS
    fut = loop.create_future()
    fired: set[int] = set()

    def wake(fd: int) -> None:
        fired.add(fd)
        if not fut.done():
            fut.set_result(None)

    added: list[int] = []
    timer = None
    try:
        for fd in w.fds:
            loop.add_reader(fd, wake, fd)
            added.append(fd)
        if w.deadline is not None:
            timer = loop.call_later(max(0.0, w.deadline - time.monotonic()), wake, -1)
        await fut
    finally:
        for fd in added:
            loop.remove_reader(fd)
        if timer is not None:
            timer.cancel()
        if w.disarm is not None:
            w.disarm()
    return frozenset(fired)
