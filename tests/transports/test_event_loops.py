"""Every transport's async endpoints under trio as under asyncio and uvloop (``anyio.run``):
``open_async_*`` give the asyncio drivers' endpoints on an asyncio loop and the anyio drivers'
under trio (shm: its asyncio driver hands each wait to anyio). Point-to-point with
backpressure, timeouts, close and the peer's end, cancellation, and a broadcast."""

from __future__ import annotations

import asyncio

import anyio
import pytest

import transports as T
from tests.transports.peers import check_message, make_message

KiB = 1024
BACKENDS = ["asyncio", "uvloop", "trio"]


def run(backend: str, body) -> None:
    async def bounded() -> None:
        if backend == "uvloop":
            assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        with anyio.fail_after(60):
            await body()
    if backend == "uvloop":
        anyio.run(bounded, backend="asyncio", backend_options={"use_uvloop": True})
    else:
        anyio.run(bounded, backend=backend)


def run_pair(transport: str, backend: str, body, capacity: int | None = None) -> None:
    """``await body(writer, reader)`` on a fresh point-to-point pair, closed afterwards."""
    async def paired() -> None:
        w = await T.open_async_writer(transport, capacity=capacity)
        try:
            r = await T.open_async_reader(w.address, connect_timeout=10)
            try:
                await body(w, r)
            finally:
                r.close()
        finally:
            w.close()
    run(backend, paired)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ordering_under_backpressure(transport: str, backend: str) -> None:
    """A small ring: the writer waits for space, the reader for data, in both directions."""
    n = 3000

    async def body(w: T.AsyncWriter, r: T.AsyncReader) -> None:
        async def write() -> None:
            for i in range(n):
                await w.send(*make_message(i, 1000 + 37 * (i % 50)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            for i in range(n):
                assert check_message(await r.recv(timeout=10), i, 1000 + 37 * (i % 50))

    run_pair(transport, backend, body, capacity=64 * KiB)


@pytest.mark.parametrize("backend", BACKENDS)
def test_timeouts_then_still_usable_and_the_peer_end(transport: str, backend: str) -> None:
    async def body(w: T.AsyncWriter, r: T.AsyncReader) -> None:
        with pytest.raises(TimeoutError):
            await r.recv(timeout=0.05)
        sent = 0
        with pytest.raises(TimeoutError):  # nobody reads: the writer runs out of room
            while sent < 100_000:
                await w.send(*make_message(sent, 1000), timeout=0.2)
                sent += 1
        assert 0 < sent < 100_000
        for i in range(sent):
            assert check_message(await r.recv(timeout=10), i, 1000)
        w.close()
        with pytest.raises(T.PeerClosedError):
            await r.recv(timeout=10)

    run_pair(transport, backend, body, capacity=64 * KiB)


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_wakes_a_waiting_recv(transport: str, backend: str) -> None:
    async def body(w: T.AsyncWriter, r: T.AsyncReader) -> None:
        errors: list[BaseException] = []

        async def waiting() -> None:
            try:
                await r.recv()
            except BaseException as e:
                errors.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            await anyio.sleep(0.1)
            r.close()
        assert len(errors) == 1 and isinstance(errors[0], T.ChannelClosedError), errors

    run_pair(transport, backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelling_a_waiting_recv_leaves_the_reader_usable(transport: str, backend: str) -> None:
    async def body(w: T.AsyncWriter, r: T.AsyncReader) -> None:
        with anyio.move_on_after(0.05) as scope:
            await r.recv()
        assert scope.cancelled_caught
        await w.send(b"after")
        assert bytes((await r.recv(timeout=10)).header) == b"after"

    run_pair(transport, backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_broadcast_reaches_every_rank(transport: str, backend: str) -> None:
    async def body() -> None:
        w = await T.open_async_broadcast_writer(transport, 2, capacity=64 * KiB)
        readers = [await T.open_async_broadcast_reader(w.address, rank, connect_timeout=10)
                   for rank in range(2)]
        got: list[list[int]] = [[], []]

        async def read(rank: int) -> None:
            for _ in range(500):
                msg = await readers[rank].recv(timeout=10)
                got[rank].append(int(bytes(msg.header)))

        try:
            async with anyio.create_task_group() as tg:
                for rank in range(2):
                    tg.start_soon(read, rank)
                for i in range(500):
                    await w.send(str(i).encode(), [b"x" * 700])
            assert got == [list(range(500))] * 2
        finally:
            w.close()
            for r in readers:
                r.close()

    run(backend, body)


def test_a_connecting_writer_and_a_binding_reader_under_trio(transport: str) -> None:
    """The roles the other way round: the reader binds, the writer connects."""
    async def body() -> None:
        r = await T.open_async_reader(transport, bind=True)
        try:
            w = await T.open_async_writer(r.address, bind=False, connect_timeout=10)
            try:
                await w.send(b"hello", [b"y" * 100])
                msg = await r.recv(timeout=10)
                assert bytes(msg.header) == b"hello" and bytes(msg.buffers[0]) == b"y" * 100
            finally:
                w.close()
        finally:
            r.close()

    run("trio", body)
