"""Every transport's async endpoints under trio as under asyncio and uvloop (the ``backend``
fixture): ``open_async_*`` give the asyncio drivers' endpoints on an asyncio loop and the anyio
drivers' under trio (shm: its asyncio driver hands each wait to anyio). Both async ends in one
loop: point-to-point through a small channel (both wait, in turn), a broadcast, and the roles the
other way round. Timeouts, close and cancellation are in the contract suite
(test_contract_*.py), which runs its async tests on the same three loops."""

from __future__ import annotations

import socket
import time

import anyio
import pytest

import transports as T
from tests.transports.conftest import run_on
from tests.transports.peers import check_message, make_message

KiB = 1024


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
    run_on(backend, paired, 60)


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

    run_on(backend, body, 60)


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

    run_on("trio", body, 60)


def test_async_backends_names_the_loops_each_transport_runs_on(transport: str) -> None:
    url = {"zmq": "zmq+ipc://@x", "uds": "uds://@x", "shm": "shm://x"}[transport]
    assert T.async_backends(transport) == T.async_backends(url) == ("asyncio", "trio")
    with pytest.raises(T.AddressError, match="unknown transport"):
        T.async_backends("carrier-pigeon://x")


def test_uds_binding_reader_gets_a_frame_that_came_with_the_hello(backend: str) -> None:
    """A binding reader waits in recv for its writer, which sends its hello and first frame in
    one write: accepting the peer reads both, and recv must return the frame at once, not wait
    on a socket that has nothing more to give (it did, until its timeout, once)."""
    from transports.uds import address as A
    from transports.uds.framing import frame_parts
    from transports.uds.peers import frame_bytes

    async def body() -> None:
        r = await T.open_async_reader("uds", bind=True)
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            async def connect_later() -> None:
                await anyio.sleep(0.1)  # the reader waits for its peer by now
                raw.connect(A.parse(r.address.removeprefix("uds://"), binding=False).sockaddr)
                first = b"".join(frame_parts(memoryview(b"first"), []))
                raw.sendall(frame_bytes(A.hello(A.WRITER, -1)) + first)

            async with anyio.create_task_group() as tg:
                tg.start_soon(connect_later)
                start = time.monotonic()
                # The bug waited out the recv's whole timeout (30 s); the frame comes after
                # the 0.1 s sleep. 10 s leaves a loaded box (2 hogged cores) room.
                assert bytes((await r.recv(timeout=30)).header) == b"first"
                assert time.monotonic() - start < 10.0
        finally:
            raw.close()
            r.close()

    run_on(backend, body, 60)
