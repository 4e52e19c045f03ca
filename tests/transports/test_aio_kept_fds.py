"""The asyncio endpoints of every transport keep their reader's fds registered with the loop from
the first wait to close (adding and removing them around every wait cost epoll_ctl calls and
handles per streamed message in the host): streamed waits register nothing and lose nothing,
what arrives while nobody waits neither gets lost nor makes the loop spin, a writer leaving is
seen at once, a cancelled wait (waiting, or woken but not resumed) leaves nothing half-consumed,
and close() and a dropped reader unregister (fd numbers get reused). What is particular to one
transport is in test_{shm,uds}_aio_fds.py."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

import pytest

import transports as T
from tests.transports.kept_fds import (
    async_pair,
    counting_loop,
    cpu_while_idle,
    recv_after_waiting,
    registered,
    run,
)

TRANSPORTS = ["shm", "uds", "zmq"]


def kept_fds(r: T.AsyncReader) -> frozenset[int]:
    """The fds the reader keeps registered (after a first wait)."""
    if hasattr(r, "_kept"):  # uds: the connection
        return frozenset({r._peers[0].sock.fileno()})  # type: ignore[attr-defined]
    if hasattr(r, "_driver"):  # shm: data eventfd, the writer's connection, close eventfd
        fds: frozenset[int] = r._driver.registered  # type: ignore[attr-defined]
        assert len(fds) == 3
        return fds
    return frozenset(r._fds)  # type: ignore[attr-defined]  # zmq: data and monitor sockets


def released(r: T.AsyncReader) -> Callable[[], bool]:
    """A check, usable after ``r`` is gone, that its fds were closed."""
    if hasattr(r, "_kept"):
        sock = r._peers[0].sock  # type: ignore[attr-defined]
        return lambda: sock.fileno() == -1
    if hasattr(r, "_driver"):
        core = r._core  # type: ignore[attr-defined]
        return lambda: bool(core.closed)
    ch = r._ch  # type: ignore[attr-defined]
    return lambda: bool(ch.closed)


def woken_not_resumed(r: T.AsyncReader) -> bool:
    """The reader's one wait was completed by the loop, and its recv has not run since."""
    if hasattr(r, "_kept"):
        waiter = r._kept.waiter  # type: ignore[attr-defined]
        return waiter is not None and waiter.done()
    waits = list((getattr(r, "_driver", None) and r._driver._waiting)  # type: ignore[attr-defined]
                 or r._fd_waiters)  # type: ignore[attr-defined]
    return len(waits) == 1 and waits[0].done()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_streamed_waits_register_nothing_and_lose_nothing(transport: str) -> None:
    async def main() -> None:
        loop = counting_loop()
        r, w = await async_pair(transport)
        try:
            await recv_after_waiting(r, w, b"first")
            kept = kept_fds(r)
            adds, removes = loop.adds, loop.removes
            for i in range(200):
                await recv_after_waiting(r, w, b"%d" % i)
            big = bytes(range(256)) * 8192  # 2 MiB: more than one read or ring record
            await recv_after_waiting(r, w, b"big", (big, b"tail"))
            await recv_after_waiting(r, w, b"after the big one")
            # Was one add and one remove per fd and wait.
            assert (loop.adds - adds, loop.removes - removes) == (0, 0)
            assert kept_fds(r) == kept
        finally:
            w.close()
            r.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_what_comes_while_nobody_waits_neither_spins_nor_gets_lost(transport: str) -> None:
    async def main() -> None:
        r, w = await async_pair(transport)
        try:
            await recv_after_waiting(r, w, b"first")
            with pytest.raises(TimeoutError):  # found nothing: the next arrival signals
                await r.recv(timeout=0.05)
            for i in range(20):  # nobody receives while these arrive: told once, re-armed
                w.send(b"late%d" % i)
            spent = await cpu_while_idle(0.5)
            assert spent < 0.1, f"the loop spun on a ready fd: {spent:.3f} s CPU in 0.5 s"
            got = [bytes((await r.recv(timeout=10)).header) for _ in range(20)]
            assert got == [b"late%d" % i for i in range(20)]
            await recv_after_waiting(r, w, b"waited for again")
            w.send(b"last")
            w.close()  # the end while nobody waits: reported once, not again and again
            spent = await cpu_while_idle(0.5)
            assert spent < 0.1, f"the loop spun at the end of stream: {spent:.3f} s CPU in 0.5 s"
            assert bytes((await r.recv(timeout=10)).header) == b"last"
            with pytest.raises(T.PeerClosedError):
                await r.recv(timeout=10)
        finally:
            w.close()
            r.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_writer_leaving_mid_wait_is_seen_at_once(transport: str) -> None:
    async def main() -> None:
        r, w = await async_pair(transport)
        try:
            await recv_after_waiting(r, w, b"first")
            task = asyncio.ensure_future(r.recv(timeout=30))
            await asyncio.sleep(0.05)
            w.close()
            start = time.monotonic()
            # The end is seen event-driven: ms on an idle box. The failure mode is a recv that
            # only ends at its 30 s timeout (a TimeoutError, not PeerClosedError); the bound is
            # 10 s, room for a loaded box (2 hogged cores) and still far below that. The
            # wait_for is a hang guard longer than the recv's own timeout.
            with pytest.raises(T.PeerClosedError):
                await asyncio.wait_for(task, 45)
            assert time.monotonic() - start < 10.0
        finally:
            r.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancelled_recv_waiting_or_woken_loses_nothing(transport: str) -> None:
    async def main() -> None:
        r, w = await async_pair(transport)
        try:
            await recv_after_waiting(r, w, b"first")
            # Waiting: cancelled, then the message sent after still arrives.
            task = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await recv_after_waiting(r, w, b"after a cancelled wait")
            # Woken (the wait's future done: for uds the bytes already read into the reader's
            # buffer, for shm the eventfd read) but not yet resumed: cancelled; the next recv
            # finds the message.
            task = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0)
            w.send(b"woke a cancelled recv")
            # Wait for the state, not a time: for zmq the frame must first cross the writer's
            # and the reader's libzmq I/O threads, which a loaded box can keep off-CPU for a
            # while. Each round gives the CPU away, then lets the loop run one pass. This task
            # always runs before the woken recv resumes: its handle is queued before the fd
            # callback's in the pass that completes the wait, so it queues its next check
            # before the recv's wake-up. 30 s: a hang guard (a wait never completed fails).
            deadline = time.monotonic() + 30
            while not woken_not_resumed(r) and time.monotonic() < deadline:
                time.sleep(0.002)
                await asyncio.sleep(0)
            assert woken_not_resumed(r) and not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert bytes((await r.recv(timeout=10)).header) == b"woke a cancelled recv"
            await recv_after_waiting(r, w, b"and the next")
        finally:
            w.close()
            r.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_and_drop_unregister_the_fds(transport: str) -> None:
    async def main() -> None:
        loop = counting_loop()
        for _ in range(3):  # the numbers get reused: a stale registration would break add_reader
            r, w = await async_pair(transport)
            await recv_after_waiting(r, w, b"x")
            fds = kept_fds(r)
            r.close()
            assert registered(loop, fds) == []
            w.close()

        r, w = await async_pair(transport)
        await recv_after_waiting(r, w, b"y")
        fds, gone = kept_fds(r), released(r)
        del r  # dropped without close(): the finalizer unregisters, then closes
        gc.collect()
        assert registered(loop, fds) == [] and gone()
        w.close()

        r, w = await async_pair(transport)
        await recv_after_waiting(r, w, b"z")
        fds, gone = kept_fds(r), released(r)
        box = [r]
        del r

        def drop() -> None:  # collected in another thread: the loop's thread unregisters
            box.clear()
            gc.collect()

        await asyncio.to_thread(drop)
        await asyncio.sleep(0.05)
        assert registered(loop, fds) == [] and gone()
        w.close()

    run(main())
