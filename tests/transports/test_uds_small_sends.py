"""uds: the sync writer's small-send fast path (one bytes frame up to 64 KiB, no timeout, one
connected reader) in one non-blocking send. These prove it loses nothing: order with the general
path, frames the socket takes only in part, a frame still going out in the background, a reader
that leaves, a closed writer."""

from __future__ import annotations

import threading
import time

import pytest

import transports as T
from transports.errors import ChannelClosedError, PeerClosedError
from transports.uds.sync import SMALL_FRAME


def _pair(capacity: int | None = None) -> tuple[T.SyncReader, T.SyncWriter]:
    extra = {} if capacity is None else {"capacity": capacity}
    r = T.open_reader("uds", bind=True, **extra)
    w = T.open_writer(r.address, bind=False, connect_timeout=10, **extra)
    return r, w


def test_small_and_general_sends_arrive_in_order() -> None:
    r, w = _pair()
    big = b"B" * (SMALL_FRAME + 1)  # too big for the fast path
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


def test_frames_the_socket_takes_in_part_arrive_whole() -> None:
    """A small socket buffer and a slow reader: most fast sends write part of their frame and
    finish it the general way."""
    r, w = _pair(capacity=4096)
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
        assert not done.is_set(), "~4.5 MB into a 4 KiB channel did not block"
        for f in frames:
            assert bytes(r.recv(timeout=10).header) == f
        t.join(10)
        assert done.is_set()
    finally:
        t.join(10)
        w.close()
        r.close()


def test_a_frame_finishing_in_the_background_goes_out_before_the_next_small_one() -> None:
    r, w = _pair(capacity=4096)
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


def test_reader_leaving_is_peer_closed_for_small_sends() -> None:
    r, w = _pair()
    try:
        w.send(b"x")
        assert bytes(r.recv(timeout=10).header) == b"x"
        r.close()
        with pytest.raises(PeerClosedError, match="is gone"):
            for _ in range(1000):
                w.send(b"y")
                time.sleep(0.001)
        with pytest.raises(PeerClosedError):  # and the writer stays broken
            w.send(b"z")
    finally:
        w.close()


def test_small_send_on_a_closed_writer_is_channel_closed() -> None:
    r, w = _pair()
    w.send(b"x")
    w.close()
    try:
        with pytest.raises(ChannelClosedError, match="is closed"):
            w.send(b"y")
    finally:
        r.close()
