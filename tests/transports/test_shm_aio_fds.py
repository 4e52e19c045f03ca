"""shm asyncio endpoints keep their fds registered with the loop from the first wait to close:
streamed waits cost no registrations, a wake-up nobody waits for neither gets lost nor makes the
loop spin, a cancelled wait in any state leaves nothing half-consumed, close() and a dropped
endpoint unregister (fd numbers get reused), and a later call on another loop moves there."""

from __future__ import annotations

import asyncio
import gc
import os
import time

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


async def _pair() -> tuple[T.AsyncReader, T.SyncWriter]:
    return await async_pair("shm")


def test_streamed_waits_register_nothing_and_lose_nothing() -> None:
    async def main() -> None:
        loop = counting_loop()
        r, w = await _pair()
        try:
            await recv_after_waiting(r, w, b"first")
            kept = r._driver.registered  # type: ignore[attr-defined]
            assert len(kept) == 3  # data eventfd, the writer's connection, the close eventfd
            adds, removes = loop.adds, loop.removes
            for i in range(200):
                await recv_after_waiting(r, w, b"%d" % i)
            # Was 600 of each: three fds added and removed around every wait.
            assert (loop.adds - adds, loop.removes - removes) == (0, 0)
            assert r._driver.registered == kept  # type: ignore[attr-defined]
        finally:
            w.close()
            r.close()

    run(main())


def test_wake_ups_nobody_waits_for_neither_spin_nor_get_lost() -> None:
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
            # Messages, then the writer's close (its eventfd write and the connection's end of
            # stream) while nobody receives: told once, nothing repeated, nothing lost.
            for i in range(20):
                w.send(b"late%d" % i)
            w.close()
            spent = await cpu_while_idle(0.5)
            assert spent < 0.1, f"the loop spun on a ready fd: {spent:.3f} s CPU in 0.5 s"
            got = [bytes((await r.recv(timeout=10)).header) for _ in range(20)]
            assert got == [b"late%d" % i for i in range(20)]
            with pytest.raises(T.PeerClosedError, match="closed"):
                await r.recv(timeout=10)
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
            with pytest.raises(T.PeerClosedError, match="disconnected"):
                await asyncio.wait_for(task, 5)
        finally:
            w.close()
            r.close()

    run(main())


def test_cancelled_recv_in_every_state_loses_nothing() -> None:
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
            # Waiting on the ring: cancelled, then the message sent after still arrives.
            task = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await recv_after_waiting(r, w, b"after a cancelled wait")
            # Woken (the eventfd read, the wait's future done) but not yet resumed: cancelled.
            task = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0)
            w.send(b"woke a cancelled recv")
            time.sleep(0.05)  # the eventfd is ready: the next pass reports it after we run
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            waits = list(r._driver._waiting)  # type: ignore[attr-defined]
            assert len(waits) == 1 and waits[0].done() and not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert bytes((await r.recv(timeout=10)).header) == b"woke a cancelled recv"
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


def test_close_and_drop_unregister_the_fds() -> None:
    async def main() -> None:
        loop = counting_loop()
        for _ in range(3):  # the numbers get reused: a stale registration would break add_reader
            r, w = await _pair()
            await recv_after_waiting(r, w, b"x")
            fds = r._driver.registered  # type: ignore[attr-defined]
            r.close()
            assert registered(loop, fds) == []
            w.close()

        r, w = await _pair()
        await recv_after_waiting(r, w, b"y")
        fds, core = r._driver.registered, r._core  # type: ignore[attr-defined]
        del r  # dropped without close(): the finalizer unregisters, then closes the core
        gc.collect()
        assert registered(loop, fds) == [] and core.closed
        w.close()

        r, w = await _pair()
        await recv_after_waiting(r, w, b"z")
        fds, core = r._driver.registered, r._core  # type: ignore[attr-defined]
        box = [r]
        del r

        def drop() -> None:  # collected in another thread: the loop's thread unregisters
            box.clear()
            gc.collect()

        await asyncio.to_thread(drop)
        await asyncio.sleep(0.05)
        assert registered(loop, fds) == [] and core.closed
        w.close()

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
