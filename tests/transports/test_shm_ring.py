"""The shm ring itself: records of every size, wrap-around, streaming of messages larger than
the ring, zero-copy views and their lifetime, broadcast cursors and backpressure."""

from __future__ import annotations

import array
import mmap
import os
import threading
from collections.abc import Iterator

import pytest

import transports
from tests.transports.shm_peers import Peers, digest_of, payload, sizes
from transports import shm
from transports.base import Message


@pytest.fixture
def peers() -> Iterator[Peers]:
    p = Peers()
    yield p
    p.close()


def as_bytes(m: Message) -> tuple[bytes, list[bytes]]:
    return bytes(m.header), [bytes(b) for b in m.buffers]


def send_in_thread(w, messages: list[tuple[bytes, list]]) -> threading.Thread:
    """Send from a thread, so messages larger than the ring can stream in one process."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for header, buffers in messages:
                w.send(header, buffers, timeout=30)
        except BaseException as e:  # surfaced by the test through the thread's attribute
            errors.append(e)

    t = threading.Thread(target=run)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


def test_every_part_shape_round_trips_in_order():
    doubles = array.array("d", [1.5, -2.25, 3.0])
    grid = memoryview(bytearray(range(24))).cast("B", (4, 6))  # 2-D, C-contiguous
    cases = [
        (b"", []),
        (b"h", [b""]),
        (b"1234567", [b"8", bytearray(b"\x00" * 9), b""]),
        (bytearray(b"header as bytearray"), [memoryview(doubles), grid]),
        (memoryview(b"-" * 4000), [b"a" * 3, b"b" * 17]),
        (memoryview(b"a forwarded header view")[2:], []),  # the header-only fast path
        (memoryview(doubles), []),  # not a byte view: the general path casts it
        (grid, []),  # 2-D: likewise
    ]
    with shm.open_writer(None, capacity=64 * 1024) as w, shm.open_reader(w.address) as r:
        for header, buffers in cases:
            w.send(header, buffers, timeout=5)
            got = r.recv(timeout=5)
            assert as_bytes(got) == (bytes(header), [bytes(memoryview(b)) for b in buffers])
        assert r.address == w.address and w.address.startswith("shm://")


def test_wrap_around_with_variable_length_records():
    """A 4 KiB ring carries 3000 messages of 0..2500 bytes: the ring wraps hundreds of times,
    records straddle the end (WRAP records) and some messages (over half the ring) stream."""
    count, seed = 3000, 7
    lens = sizes(seed, count, 2500)
    msgs = [(i.to_bytes(4, "little"), [payload(seed, i, n)]) for i, n in enumerate(lens)]
    with shm.open_writer(None, capacity=4096) as w, shm.open_reader(w.address) as r:
        t = send_in_thread(w, msgs)
        for i in range(count):
            assert as_bytes(r.recv(timeout=30)) == (msgs[i][0], msgs[i][1]), f"message {i}"
        t.join()
        assert not t.errors
        assert sum(lens) > 300 * 4096


def test_message_far_larger_than_the_ring_streams_between_processes(peers):
    """64 MiB (+3 odd bytes) through a 1 MiB ring, with other sizes around it, from a spawned
    writer process: every byte arrives, in order."""
    seed, count, biggest = 3, 6, 64 * 1024 * 1024 + 3
    name = f"shm://big-{os.getpid()}-{id(peers)}"  # abstract names are machine-wide
    proc = peers.spawn("produce", name, seed, count, biggest, 1 << 20)
    with shm.open_reader(name) as r:
        for i, n in enumerate(sizes(seed, count, biggest)):
            m = r.recv(timeout=60)
            assert int.from_bytes(m.header, "little") == i
            assert len(m.buffers[0]) == n
            assert m.buffers[0] == payload(seed, i, n), f"message {i} ({n} bytes) differs"
            assert m.buffers[1] == b"x" * (i % 3)
    peers.join(proc)


def test_received_views_point_into_the_ring_until_the_next_recv():
    """Zero copy: a small message is a view of the shared mapping, its space stays reserved
    while the caller holds it, and is handed back to the writer by the next recv."""
    rec = 2600  # three of these fill most of an 8 KiB ring
    with shm.open_writer(None, capacity=8192) as w, shm.open_reader(w.address) as r:
        for i in range(3):
            w.send(bytes([i]) * rec, timeout=5)
        first = r.recv(timeout=5)
        assert isinstance(first.header.obj, mmap.mmap)
        with pytest.raises(TimeoutError):
            w.send(b"\xff" * rec, timeout=0.05)  # first's record is still held
        assert first.header == b"\x00" * rec
        assert r.recv(timeout=5).header == b"\x01" * rec  # releases the first record
        w.send(b"\xff" * rec, timeout=5)
        assert r.recv(timeout=5).header == b"\x02" * rec
        assert r.recv(timeout=5).header == b"\xff" * rec


def test_full_ring_blocks_the_writer_and_drops_nothing():
    with shm.open_writer(None, capacity=4096) as w, shm.open_reader(w.address) as r:
        sent = 0
        with pytest.raises(TimeoutError, match="ring is full"):
            while True:
                w.send(sent.to_bytes(4, "little") + b"." * 100, timeout=0.05)
                sent += 1
        assert sent >= 4096 // 136 - 1
        for i in range(sent):
            assert r.recv(timeout=5).header[:4] == i.to_bytes(4, "little")
        with pytest.raises(TimeoutError, match="no message arrived"):
            r.recv(timeout=0.05)


def test_writer_timing_out_mid_stream_delivers_nothing_partial():
    """A streamed send that times out half-way is dropped by the reader; the next message
    arrives intact."""
    with shm.open_writer(None, capacity=4096) as w, shm.open_reader(w.address) as r:
        with pytest.raises(TimeoutError):
            w.send(b"big", [b"z" * 20000], timeout=0.1)
        with pytest.raises(TimeoutError):
            r.recv(timeout=0.05)  # consumes the orphaned chunks, returns nothing
        w.send(b"after", [b"ok"], timeout=5)
        assert as_bytes(r.recv(timeout=5)) == (b"after", [b"ok"])


def test_broadcast_cursors_are_per_reader_and_the_writer_waits_for_the_slowest():
    with shm.open_broadcast_writer(None, 2, capacity=4096) as w, \
            shm.open_broadcast_reader(w.address, 0) as fast, \
            shm.open_broadcast_reader(w.address, 1) as slow:
        sent = 0
        with pytest.raises(TimeoutError):
            while True:
                w.send(sent.to_bytes(4, "little"), [b"." * 200], timeout=0.05)
                sent += 1
                assert fast.recv(timeout=5).header == (sent - 1).to_bytes(4, "little")
        # The fast reader has everything, yet the writer is blocked by the slow one.
        with pytest.raises(TimeoutError):
            fast.recv(timeout=0.05)
        with pytest.raises(TimeoutError):
            w.send(b"blocked", timeout=0.05)
        for i in range(2):
            assert slow.recv(timeout=5).header == i.to_bytes(4, "little")
        w.send(b"room again", timeout=5)  # the slow reader freed space
        for i in range(2, sent):
            assert slow.recv(timeout=5).header == i.to_bytes(4, "little")
        assert slow.recv(timeout=5).header == b"room again"
        assert fast.recv(timeout=5).header == b"room again"


def test_broadcast_reaches_every_reader_process_even_a_slow_one(peers):
    """Three spawned readers (one sleeping after each message) get identical streams,
    including messages larger than the ring."""
    seed, count = 11, 40
    lens = sizes(seed, count, 300_000)
    msgs = [(i.to_bytes(4, "little"), [payload(seed, i, n)]) for i, n in enumerate(lens)]
    with shm.open_broadcast_writer(None, 3, capacity=64 * 1024) as w:
        outs = [shm.open_reader(None, bind=True) for _ in range(3)]
        try:
            procs = [peers.spawn("digest", w.address, rank, count, outs[rank].address,
                                 0.01 if rank == 2 else 0) for rank in range(3)]
            for header, buffers in msgs:
                w.send(header, buffers, timeout=30)
            expected = digest_of(msgs)
            for rank, out in enumerate(outs):
                report = bytes(out.recv(timeout=60).header)
                assert report[:32] == expected, f"reader {rank} got a different stream"
            for proc in procs:
                peers.join(proc)
        finally:
            for out in outs:
                out.close()


def test_first_broadcast_send_waits_for_every_rank():
    with shm.open_broadcast_writer(None, 2, capacity=8192, connect_timeout=30) as w, \
            shm.open_broadcast_reader(w.address, 1) as r1:
        with pytest.raises(TimeoutError, match=r"1 of 2"):
            w.send(b"too early", timeout=0.2)
        with shm.open_broadcast_reader(w.address, 0) as r0:
            w.send(b"everyone", timeout=5)
            assert r0.recv(timeout=5).header == b"everyone"
            assert r1.recv(timeout=5).header == b"everyone"


def test_reader_may_bind_and_writer_connect(peers):
    """The other role binds: the parent's reader binds, a spawned writer connects to it (the
    echo peer), and the parent's writer binds for the other direction."""
    with shm.open_writer(None, capacity=1 << 16) as w, \
            shm.open_reader(None, bind=True) as r:
        proc = peers.spawn("echo", w.address, r.address)
        for i in range(50):
            header, bufs = payload(1, i, i * 37), [payload(2, i, 5000 - i)]
            w.send(header, bufs, timeout=10)
            assert as_bytes(r.recv(timeout=10)) == (header, bufs)
        w.close()
        peers.join(proc)


def _rss_of_ring_mappings(name: str) -> list[int]:
    """Resident bytes of each of this process's mappings of the ring named ``name``."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    found = []
    for i, line in enumerate(lines):
        if f"memfd:aioengine-shm-{name}" in line:
            rss = next(row for row in lines[i + 1:] if row.startswith("Rss:"))
            found.append(int(rss.split()[1]) * 1024)
    return found


def test_the_ring_is_prefaulted_on_both_sides_and_sized_by_the_factory_default():
    """No page fault on the hot path: the writer's and the reader's mappings are resident
    before the first message (a lazily committed ring faults on each page's first lap)."""
    cap = transports.factory.default_capacity("shm")
    assert cap == transports.factory.SHM_DEFAULT_CAPACITY == 16 * 1024 * 1024
    with transports.open_writer("shm") as w:
        name = w.address.removeprefix("shm://")
        with transports.open_reader(w.address) as r:
            w.send(b"x", timeout=5)  # hands the ring over; the reader maps it at its recv
            assert bytes(r.recv(timeout=5).header) == b"x"
            # Both endpoints live in this process: two mappings, each fully resident.
            rss = _rss_of_ring_mappings(name)
            assert len(rss) == 2 and min(rss) >= cap, rss
