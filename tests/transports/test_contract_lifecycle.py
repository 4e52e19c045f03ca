"""The transport contract, lifecycle: peer death (SIGKILL), close while waiting, cancellation
without loss, bad arguments, random message sequences (hypothesis)."""

from __future__ import annotations

import random
import threading
import time

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transports as T
from tests.transports.conftest import Later, run_on
from tests.transports.peers import Peer, check_message

# Death is seen event-driven (POLLHUP, eventfd, zmq's monitor): ms on an idle box, and the
# contract says 1 s. The failure mode is a reader that only learns of it when its recv times
# out, so the recv waits 60 s and the bound is 10 s: room for a loaded box (2 hogged cores),
# still far below the timeout a death-blind recv would wait out.
DEATH_SEEN_BOUND = 10.0


@pytest.mark.parametrize("mode", ["sync", "asyncio", "trio"])
def test_sigkilled_writer_is_seen_within_one_second(transport: str, mode: str) -> None:
    peer = Peer("writer", transport, 3, 100, "sync", 600)  # sends 3, then idles
    try:
        address = peer.wait_ready()
        if mode == "sync":
            r = T.open_reader(address, connect_timeout=30)
            try:
                for i in range(3):
                    assert check_message(r.recv(timeout=30), i, 100)
                peer.proc.kill()
                start = time.monotonic()
                with pytest.raises(T.PeerClosedError):
                    r.recv(timeout=60)
                assert time.monotonic() - start < DEATH_SEEN_BOUND
            finally:
                r.close()
        else:
            async def body() -> float:
                r = await T.open_async_reader(address, connect_timeout=30)
                try:
                    for i in range(3):
                        assert check_message(await r.recv(timeout=30), i, 100)
                    async with anyio.create_task_group() as tg:
                        waiting = Later(tg, lambda: r.recv(timeout=60))
                        await anyio.sleep(0.1)  # the reader is now parked, waiting
                        peer.proc.kill()
                        start = time.monotonic()
                        with pytest.raises(T.PeerClosedError):
                            await waiting.get()
                    return time.monotonic() - start
                finally:
                    r.close()

            assert run_on(mode, body) < DEATH_SEEN_BOUND
    finally:
        peer.kill()


def test_close_wakes_a_blocked_sync_reader(transport: str) -> None:
    w = T.open_writer(transport)
    r = T.open_reader(w.address)
    try:
        caught: list[BaseException] = []

        def wait() -> None:
            try:
                r.recv()
            except BaseException as e:
                caught.append(e)

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        time.sleep(0.2)
        r.close()
        t.join(30)  # a hang guard (loaded box): the recv has no timeout of its own
        assert not t.is_alive(), "close() must wake the waiting recv"
        assert len(caught) == 1 and isinstance(caught[0], T.ChannelClosedError)
        with pytest.raises(T.ChannelClosedError):
            r.recv(timeout=0)
        r.close()  # idempotent
    finally:
        w.close()
        r.close()


def test_close_wakes_a_blocked_sync_writer(transport: str) -> None:
    w = T.open_writer(transport, capacity=64 * 1024)
    r = T.open_reader(w.address)
    try:
        caught: list[BaseException] = []

        def flood() -> None:
            try:
                for _ in range(1_000_000):
                    w.send(b"x", [bytes(4096)])
            except BaseException as e:
                caught.append(e)

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        time.sleep(0.5)
        w.close()
        t.join(30)  # a hang guard (loaded box): the send has no timeout of its own
        assert not t.is_alive(), "close() must wake the blocked send"
        assert len(caught) == 1 and isinstance(caught[0], T.ChannelClosedError)
    finally:
        w.close()
        r.close()


def test_close_wakes_async_waiters(transport: str, backend: str) -> None:
    async def body() -> None:
        w = await T.open_async_writer(transport)
        r = await T.open_async_reader(w.address)
        try:
            async with anyio.create_task_group() as tg:
                waiting = Later(tg, r.recv)
                await anyio.sleep(0.1)
                assert not waiting.done()
                r.close()
                # A hang guard (loaded box): the recv has no timeout of its own.
                with anyio.fail_after(30), pytest.raises(T.ChannelClosedError):
                    await waiting.get()
            with pytest.raises(T.ChannelClosedError):
                await r.recv(timeout=0)
        finally:
            w.close()
            r.close()

    run_on(backend, body)


def test_cancelled_recv_loses_no_message(transport: str, backend: str) -> None:
    count = 400

    async def body() -> None:
        w = await T.open_async_writer(transport)
        r = await T.open_async_reader(w.address)
        rng = random.Random(7)

        async def produce() -> None:
            for i in range(count):
                await w.send(i.to_bytes(4, "little"), [bytes(rng.randrange(0, 3000))])
                if i % 10 == 0:
                    await anyio.sleep(0.001)

        got: list[int] = []
        cancelled = 0
        try:
            async with anyio.create_task_group() as tg:
                producer = Later(tg, produce)
                while len(got) < count:
                    msg = None
                    with anyio.move_on_after(rng.choice([0, 0.0005, 0.002])):
                        msg = await r.recv()
                    if msg is None:
                        cancelled += 1
                    else:
                        got.append(int.from_bytes(msg.header, "little"))
                await producer.get()
        finally:
            w.close()
            r.close()
        assert got == list(range(count))
        assert cancelled > 0, "the test must actually cancel receives"

    run_on(backend, body)


def test_bad_arguments_are_named(transport: str) -> None:
    with pytest.raises(T.AddressError, match="unknown transport"):
        T.open_writer("carrier-pigeon://x")
    with pytest.raises(T.AddressError):
        T.open_writer("nonsense")
    w = T.open_writer(transport)
    r = T.open_reader(w.address)
    try:
        with pytest.raises(TypeError, match="header"):
            w.send("text is not bytes")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"buffers"):
            w.send(b"h", [123])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="single"):
            w.send(b"h", b"not a list")
        with pytest.raises(ValueError, match="timeout"):
            w.send(b"h", timeout=-1)
        with pytest.raises(ValueError, match="timeout"):
            r.recv(timeout=-0.5)
        w.send(b"still fine")
        assert bytes(r.recv(timeout=10).header) == b"still fine"
    finally:
        w.close()
        r.close()
    with pytest.raises(ValueError, match="num_readers"):
        T.open_broadcast_writer(transport, 0)
    bw = T.open_broadcast_writer(transport, 1)
    try:
        with pytest.raises(ValueError, match="rank"):
            T.open_broadcast_reader(bw.address, -1)
    finally:
        bw.close()


message_lists = st.lists(
    st.tuples(st.binary(max_size=300),
              st.lists(st.binary(max_size=3000) | st.sampled_from([b"", b"\0" * 70_000]),
                       max_size=4)),
    min_size=1, max_size=20)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(messages=message_lists)
def test_random_sequences_round_trip_byte_identical(transport: str, messages) -> None:
    w = T.open_writer(transport)
    r = T.open_reader(w.address)
    try:
        def produce() -> None:
            for header, bufs in messages:
                w.send(header, bufs)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        for header, bufs in messages:
            msg = r.recv(timeout=30)
            assert bytes(msg.header) == header
            assert [bytes(b) for b in msg.buffers] == bufs
        t.join(30)
    finally:
        w.close()
        r.close()
