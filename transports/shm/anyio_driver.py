"""Carrying out a ``Wait`` through anyio: the driver of an async endpoint used on an event loop
other than asyncio's (trio). The cores are the same generators the blocking and asyncio
drivers run; only the waiting differs.

Each wait watches its fds for that wait only (``anyio.wait_readable``, one task per fd under a
cancel scope that the first to fire, or the deadline, cancels). That costs a task per fd per
wait, where the asyncio driver keeps its fds registered with the loop (see ``aio_driver``): the
asyncio path is the measured one; this one makes the endpoints usable under trio at all.

An eventfd that fires is read at once (it only says "look at the ring"; every wait re-checks
the ring when it arms), so the next wait does not see it again; a read that finds it empty was
a stale report and the watch goes on. A socket (a peer's connection, a listening socket) is
only reported. Closing the core writes its close eventfd, which every wait watches: that is
the wake-up of a close from the same or another thread.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Generator
from typing import TypeVar

import anyio

from transports.shm.core import NO_FDS, Wait

T = TypeVar("T")


async def run(gen: Generator[Wait, frozenset[int], T]) -> T:
    """Run one operation's generator to its end; cancellation closes it (the operation undoes
    what it had staged)."""
    try:
        wait = next(gen)
        while True:
            wait = gen.send(await _wait(wait))
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        gen.close()


async def _wait(w: Wait) -> frozenset[int]:
    if w.arm is not None and not w.arm():
        return NO_FDS
    fired: set[int] = set()
    try:
        left = math.inf if w.deadline is None else max(0.0, w.deadline - time.monotonic())
        with anyio.move_on_after(left):
            async with anyio.create_task_group() as tg:
                for fd in w.fds:
                    tg.start_soon(_watch, fd, w.arm is not None, fired, tg.cancel_scope)
                if not w.fds:
                    await anyio.sleep_forever()  # only the deadline ends such a wait
    finally:
        if w.disarm is not None:
            w.disarm()
    return frozenset(fired)


async def _watch(fd: int, kept: bool, fired: set[int], scope: anyio.CancelScope) -> None:
    eventfd = kept and not stat.S_IFMT(os.fstat(fd).st_mode)  # anonymous inode: an eventfd
    while True:
        await anyio.wait_readable(fd)
        if not eventfd:
            break
        try:
            os.eventfd_read(fd)
            break
        except BlockingIOError:
            continue  # drained since it was reported (a disarm): nothing new
    fired.add(fd)
    scope.cancel()
