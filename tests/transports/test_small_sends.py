"""The writers' small-send fast paths (one bytes frame, no timeout: uds writes it in one
non-blocking send, zmq looks at the monitor only every ``LOOK_EVERY`` s, shm puts one record
into the ring) lose nothing: order with the general path, frames the channel takes only in
part, a reader that leaves, a closed writer; per transport: a frame still going out in the
background (uds), a second reader (zmq)."""

from __future__ import annotations

import threading
import time

import pytest

import transports as T
from transports.errors import ChannelClosedError, PeerClosedError, TransportError

TRANSPORTS = ["uds", "zmq", "shm"]
SMALLEST = {"uds": 4096, "zmq": 64 * 1024, "shm": 4096}
"""The smallest channel each takes (zmq: one 64 KiB message a side; shm: its smallest ring)."""
FAST_LIMIT = 64 * 1024  # uds's SMALL_FRAME, zmq's COPY_BELOW: larger frames take the general path


def _pair(transport: str, capacity: int | None = None) -> tuple[T.SyncReader, T.SyncWriter]:
    extra = {} if capacity is None else {"capacity": capacity}
    r = T.open_reader(transport, bind=True, **extra)
    w = T.open_writer(r.address, bind=False, connect_timeout=10, **extra)
    return r, w


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_small_and_general_sends_arrive_in_order(transport: str) -> None:
    r, w = _pair(transport)
    big = b"B" * (FAST_LIMIT + 1)  # too big for the fast path
    try:
        sent = []
        for i in range(300):
            msg = big if i % 7 == 3 else f"small {i}".encode() * (i % 5)
            if i % 11 == 5:  # a buffer list, a timeout or another buffer type: general path
                w.send(msg[:4], [msg[4:]])
                sent.append((msg[:4], [msg[4:]]))
                continue
            if i % 13 == 0:
                w.send(msg, timeout=10)
            elif i % 17 == 0:
                w.send(bytearray(msg))
            else:
                w.send(msg)
            sent.append((msg, []))
        for head, rest in sent:
            got = r.recv(timeout=10)
            assert bytes(got.header) == head
            assert [bytes(b) for b in got.buffers] == rest
    finally:
        w.close()
        r.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_full_channel_blocks_small_sends_until_the_reader_drains(transport: str) -> None:
    """The smallest channel and a slow reader: the fast path fills it up (uds: most sends
    write part of their frame and finish it the general way), then the general path waits."""
    r, w = _pair(transport, capacity=SMALLEST[transport])
    frames = [bytes([i % 251]) * (1000 + 97 * i) for i in range(300)]  # up to ~30 KiB
    done = threading.Event()

    def write() -> None:
        for f in frames:
            w.send(f)
        done.set()

    t = threading.Thread(target=write)
    try:
        t.start()
        time.sleep(0.2)
        assert not done.is_set(), "~4.5 MB into the smallest channel did not block"
        for f in frames:
            assert bytes(r.recv(timeout=10).header) == f
        t.join(10)
        assert done.is_set()
    finally:
        t.join(10)
        w.close()
        r.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reader_leaving_is_peer_closed_for_small_sends(transport: str) -> None:
    r, w = _pair(transport)
    try:
        w.send(b"x")
        assert bytes(r.recv(timeout=10).header) == b"x"
        r.close()
        start = time.monotonic()
        # Seen event-driven (EPIPE, eventfd, zmq's monitor): ms on an idle box. The sends go on
        # for up to 30 s (a hang guard: a writer that never notices fails "DID NOT RAISE"); the
        # bound is 10 s, room for a loaded box (2 hogged cores, libzmq's monitor thread
        # off-CPU) while still failing a writer that notices only late.
        with pytest.raises(PeerClosedError):
            while time.monotonic() - start < 30:
                w.send(b"y")
                time.sleep(0.001)
        assert time.monotonic() - start < 10.0  # zmq's monitor look is throttled, not dropped
        with pytest.raises(PeerClosedError):  # and the writer stays broken
            w.send(b"z")
    finally:
        w.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_small_send_on_a_closed_writer_is_channel_closed(transport: str) -> None:
    r, w = _pair(transport)
    w.send(b"x")
    w.close()
    try:
        with pytest.raises(ChannelClosedError, match="is closed"):
            w.send(b"y")
    finally:
        r.close()


def test_uds_frame_finishing_in_the_background_goes_out_before_the_next_small_one() -> None:
    r, w = _pair("uds", capacity=4096)
    big = b"S" * 200_000
    after = threading.Thread(target=w.send, args=(b"after",))
    try:
        w.send(big, timeout=0.05)  # the channel fills: the rest is finished in the background
        after.start()  # must wait for it, not overtake it
        assert bytes(r.recv(timeout=10).header) == big
        assert bytes(r.recv(timeout=10).header) == b"after"
    finally:
        if after.ident is not None:
            after.join(10)
        w.close()
        r.close()


def test_zmq_second_reader_is_an_error_for_small_sends() -> None:
    w = T.open_writer("zmq", bind=True)
    r1 = T.open_reader(w.address, bind=False, connect_timeout=10)
    r2 = None
    try:
        w.send(b"one")
        r2 = T.open_reader(w.address, bind=False, connect_timeout=10)
        with pytest.raises(TransportError, match="a second peer connected"):
            for _ in range(500):
                w.send(b"y")
                time.sleep(0.01)
    finally:
        for e in (r2, r1, w):
            if e is not None:
                e.close()
