"""zmq: the writer's small-send fast path (one small bytes frame, no timeout) looks at the
monitor only every ``LOOK_EVERY`` s, so these prove it loses nothing: order with the general
path, a reader that leaves, a second reader, a full channel, a closed writer."""

from __future__ import annotations

import threading
import time

import pytest

import transports as T
from transports.errors import ChannelClosedError, PeerClosedError, TransportError
from transports.zmq import channel as C


def test_small_and_large_sends_arrive_in_order() -> None:
    r = T.open_reader("zmq", bind=True)
    w = T.open_writer(r.address, bind=False, connect_timeout=10)
    big = b"B" * C.COPY_BELOW  # too big for the fast path
    try:
        sent = []
        for i in range(200):
            msg = big if i % 7 == 3 else f"small {i}".encode()
            if i % 11 == 5:  # a buffer list or a timeout also take the general path
                w.send(msg[:4], [msg[4:]])
                sent.append((msg[:4], msg[4:]))
                continue
            w.send(msg, timeout=10) if i % 13 == 0 else w.send(msg)
            sent.append((msg, None))
        for head, rest in sent:
            got = r.recv(timeout=10)
            assert bytes(got.header) == head
            assert [bytes(b) for b in got.buffers] == ([] if rest is None else [rest])
    finally:
        w.close()
        r.close()


def test_reader_leaving_is_peer_closed_for_small_sends() -> None:
    r = T.open_reader("zmq", bind=True)
    w = T.open_writer(r.address, bind=False, connect_timeout=10)
    try:
        w.send(b"x")
        assert bytes(r.recv(timeout=10).header) == b"x"
        r.close()
        start = time.monotonic()
        with pytest.raises(PeerClosedError, match="is gone"):
            while time.monotonic() - start < 5:
                w.send(b"y")
                time.sleep(0.001)
        assert time.monotonic() - start < 1.0  # the monitor look is throttled, not dropped
    finally:
        w.close()


def test_second_reader_is_an_error_for_small_sends() -> None:
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


def test_full_channel_blocks_small_sends_until_the_reader_drains() -> None:
    r = T.open_reader("zmq", bind=True, capacity=C.COPY_BELOW)  # hwm 1 on the reader's side
    w = T.open_writer(r.address, bind=False, capacity=C.COPY_BELOW, connect_timeout=10)
    count = 2000
    done = threading.Event()

    def write() -> None:
        for i in range(count):
            w.send(i.to_bytes(4, "little"))  # the fast path fills up, then the general path
        done.set()

    t = threading.Thread(target=write)
    try:
        t.start()
        time.sleep(0.3)
        assert not done.is_set(), "2000 sends into a channel of a few messages did not block"
        got = [int.from_bytes(r.recv(timeout=10).header, "little") for _ in range(count)]
        assert got == list(range(count))
        t.join(10)
        assert done.is_set()
    finally:
        t.join(10)
        w.close()
        r.close()


def test_small_send_on_a_closed_writer_is_channel_closed() -> None:
    r = T.open_reader("zmq", bind=True)
    w = T.open_writer(r.address, bind=False, connect_timeout=10)
    w.send(b"x")
    w.close()
    try:
        with pytest.raises(ChannelClosedError, match="is closed"):
            w.send(b"y")
    finally:
        r.close()
