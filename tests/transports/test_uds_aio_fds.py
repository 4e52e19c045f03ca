"""The uds asyncio reader keeps its connection registered with the loop from the first wait to
close: streamed waits cost no registrations, bytes that come while nobody waits neither get
lost nor make the loop spin, a cancelled wait in any state leaves nothing half-consumed, and
close() and a dropped reader unregister (fd numbers get reused)."""

from __future__ import annotations

import asyncio
import gc
import socket
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
    return await async_pair("uds")


def _fd(r: T.AsyncReader) -> frozenset[int]:
    return frozenset({r._peers[0].sock.fileno()})  # type: ignore[attr-defined]


def test_streamed_waits_register_nothing_and_lose_nothing() -> None:
    async def main() -> None:
        loop = counting_loop()
        r, w = await _pair()
        try:
            await recv_after_waiting(r, w, b"first")
            adds, removes = loop.adds, loop.removes
            for i in range(200):
                await recv_after_waiting(r, w, b"%d" % i)
            # Was 200 of each: the connection added and removed around every wait.
            assert (loop.adds - adds, loop.removes - removes) == (0, 0)
            big = bytes(range(256)) * 8192  # 2 MiB: more than the frame reader's chunk
            await recv_after_waiting(r, w, b"big", (big, b"tail"))
            await recv_after_waiting(r, w, b"after the big one")
            assert (loop.adds - adds, loop.removes - removes) == (0, 0)
        finally:
            w.close()
            r.close()

    run(main())


def test_bytes_nobody_waits_for_neither_spin_nor_get_lost() -> None:
    async def main() -> None:
        r, w = await _pair()
        try:
            await recv_after_waiting(r, w, b"first")
            for i in range(20):  # nobody receives while these arrive
                w.send(b"late%d" % i)
            spent = await cpu_while_idle(0.5)
            assert spent < 0.1, f"the loop spun on a ready socket: {spent:.3f} s CPU in 0.5 s"
            got = [bytes((await r.recv(timeout=10)).header) for _ in range(20)]
            assert got == [b"late%d" % i for i in range(20)]
            await recv_after_waiting(r, w, b"waited for again")
            w.send(b"last")
            w.close()  # end of stream while nobody waits: reported once, not again and again
            spent = await cpu_while_idle(0.5)
            assert spent < 0.1, f"the loop spun at end of stream: {spent:.3f} s CPU in 0.5 s"
            assert bytes((await r.recv(timeout=10)).header) == b"last"
            with pytest.raises(T.PeerClosedError, match="closed the connection"):
                await r.recv(timeout=10)
        finally:
            w.close()
            r.close()

    run(main())


def test_a_writer_leaving_mid_wait_is_seen_at_once() -> None:
    async def main() -> None:
        r, w = await _pair()
        try:
            await recv_after_waiting(r, w, b"first")
            task = asyncio.ensure_future(r.recv(timeout=30))
            await asyncio.sleep(0.05)
            w.close()
            with pytest.raises(T.PeerClosedError, match="closed the connection"):
                await asyncio.wait_for(task, 5)
        finally:
            r.close()

    run(main())


def test_cancelled_recv_in_every_state_loses_nothing() -> None:
    async def main() -> None:
        r, w = await _pair()
        try:
            await recv_after_waiting(r, w, b"first")
            # Waiting: cancelled, then the message sent after still arrives.
            task = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await recv_after_waiting(r, w, b"after a cancelled wait")
            # Woken (the bytes read into the reader's buffer, the wait's future done) but not
            # yet resumed: cancelled; the next recv finds the message in the buffer.
            task = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0)
            w.send(b"woke a cancelled recv")
            time.sleep(0.05)  # the bytes are there: the next pass reports them after we run
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            waiter = r._kept.waiter  # type: ignore[attr-defined]
            assert waiter is not None and waiter.done() and not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert bytes((await r.recv(timeout=10)).header) == b"woke a cancelled recv"
            # Half a frame read by the wake-up, then cancelled: the rest completes it.
            whole = b"".join(_frame(b"in two halves"))
            task = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0)
            raw = socket.socket(fileno=w._peers[0].sock.fileno())  # type: ignore[attr-defined]
            try:
                raw.send(whole[:7])
                time.sleep(0.05)
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                raw.send(whole[7:])
            finally:
                raw.detach()
            assert bytes((await r.recv(timeout=10)).header) == b"in two halves"
            await recv_after_waiting(r, w, b"and the next")
        finally:
            w.close()
            r.close()

    run(main())


def _frame(header: bytes) -> list[memoryview]:
    from transports.uds.framing import frame_parts
    return frame_parts(memoryview(header), [])


def test_close_and_drop_unregister_the_connection() -> None:
    async def main() -> None:
        loop = counting_loop()
        for _ in range(3):  # the numbers get reused: a stale registration would break add_reader
            r, w = await _pair()
            await recv_after_waiting(r, w, b"x")
            fds = _fd(r)
            r.close()
            assert registered(loop, fds) == []
            w.close()

        r, w = await _pair()
        await recv_after_waiting(r, w, b"y")
        fds, sock = _fd(r), r._peers[0].sock  # type: ignore[attr-defined]
        del r  # dropped without close(): the finalizer unregisters, then closes the socket
        gc.collect()
        assert registered(loop, fds) == [] and sock.fileno() == -1
        w.close()

        r, w = await _pair()
        await recv_after_waiting(r, w, b"z")
        fds, sock = _fd(r), r._peers[0].sock  # type: ignore[attr-defined]
        box = [r]
        del r

        def drop() -> None:  # collected in another thread: the loop's thread unregisters
            box.clear()
            gc.collect()

        await asyncio.to_thread(drop)
        await asyncio.sleep(0.05)
        assert registered(loop, fds) == [] and sock.fileno() == -1
        w.close()

    run(main())
