"""shm asyncio endpoints, what the kept registrations of every transport (test_aio_kept_fds.py)
do not cover: a stale eventfd wake-up, a writer's death seen through its connection alone, a
cancelled rendezvous wait, a cancelled send waiting for space, and a later call on another
loop moving the registrations there."""

from __future__ import annotations

import asyncio
import os

import pytest

import transports as T
from tests.transports.kept_fds import (
    async_pair,
    cpu_while_idle,
    recv_after_waiting,
    registered,
    run,
)


async def _pair() -> tuple[T.AsyncReader, T.SyncWriter]:
    return await async_pair("shm")


def test_a_stale_wake_up_neither_spins_nor_is_a_message() -> None:
    async def main() -> None:
        r, w = await _pair()
        try:
            await recv_after_waiting(r, w, b"first")
            # A wake-up left over from a sleep already over (the writer saw the flag just before
            # the reader withdrew it): the loop reads it once and idles.
            os.eventfd_write(r._core._efd, 1)  # type: ignore[attr-defined]
            spent = await cpu_while_idle(0.5)
            assert spent < 0.1, f"the loop spun on a ready eventfd: {spent:.3f} s CPU in 0.5 s"
            with pytest.raises(TimeoutError):  # a stale wake-up is no message
                await r.recv(timeout=0.05)
            await recv_after_waiting(r, w, b"and the next")
        finally:
            w.close()
            r.close()

    run(main())


def test_a_writer_dying_mid_wait_is_seen_at_once() -> None:
    async def main() -> None:
        r, w = await _pair()
        try:
            await recv_after_waiting(r, w, b"first")
            task = asyncio.ensure_future(r.recv(timeout=30))
            await asyncio.sleep(0.05)
            # The connection ends without the ring being marked closed (as when the writer's
            # process dies): only the kept registration of the connection can tell the recv.
            w._core._links[0].shutdown(2)  # type: ignore[attr-defined]
            # Seen event-driven: ms on an idle box. A recv blind to it would wait out its 30 s
            # timeout; 10 s leaves a loaded box (2 hogged cores) room and still fails that.
            with pytest.raises(T.PeerClosedError, match="disconnected"):
                await asyncio.wait_for(task, 10)
        finally:
            w.close()
            r.close()

    run(main())


def test_cancelled_rendezvous_wait_leaves_nothing_registered() -> None:
    async def main() -> None:
        r = await T.open_async_reader("shm", bind=True)
        # Waiting for the writer to come at all (the rendezvous wait): cancelled.
        task = asyncio.ensure_future(r.recv())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert r._driver.registered == frozenset()  # type: ignore[attr-defined]
        w = await asyncio.to_thread(T.open_writer, r.address, bind=False, connect_timeout=10)
        try:
            await recv_after_waiting(r, w, b"first")
            await recv_after_waiting(r, w, b"and the next")
        finally:
            w.close()
            r.close()

    run(main())


def test_cancelled_send_waiting_for_space_stages_nothing() -> None:
    async def main() -> None:
        w = await T.open_async_writer("shm", capacity=64 * 1024)
        r = await asyncio.to_thread(T.open_reader, w.address, connect_timeout=10)
        try:
            sent, blob = 0, b"x" * 10_000
            while True:  # fill the ring until a send has to wait for space
                task = asyncio.ensure_future(w.send(b"%d" % sent, [blob]))
                await asyncio.sleep(0.02)
                if not task.done():
                    break
                await task
                sent += 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            got = [bytes(m.header) for m in
                   [await asyncio.to_thread(r.recv, 10) for _ in range(sent)]]
            assert got == [b"%d" % i for i in range(sent)]
            with pytest.raises(TimeoutError):  # the cancelled one left nothing in the ring
                await asyncio.to_thread(r.recv, 0.1)
            # The writer waits for space again and again (its registration kept), woken each
            # time by the reader draining the ring in another thread.
            n = 10 * sent

            def drain() -> list[bytes]:
                return [bytes(r.recv(10).header) for _ in range(n)]

            reading = asyncio.ensure_future(asyncio.to_thread(drain))
            for i in range(n):
                await w.send(b"again%d" % i, [blob])
            assert await reading == [b"again%d" % i for i in range(n)]
        finally:
            w.close()
            r.close()

    run(main())


def test_a_later_call_on_another_loop_moves_the_registrations() -> None:
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        r, w = first.run_until_complete(_pair())
        first.run_until_complete(recv_after_waiting(r, w, b"on the first loop"))
        fds = r._driver.registered  # type: ignore[attr-defined]
        second.run_until_complete(recv_after_waiting(r, w, b"on the second loop"))
        assert registered(first, fds) == []  # moved off the first loop
        assert r._driver.registered == fds  # type: ignore[attr-defined]
        second.close()  # a closed loop took its registrations with it: nothing to undo there
        third = asyncio.new_event_loop()
        try:
            third.run_until_complete(recv_after_waiting(r, w, b"on the third loop"))
            r.close()
            assert registered(third, fds) == []
        finally:
            third.close()
        w.close()
    finally:
        first.close()
        second.close()
