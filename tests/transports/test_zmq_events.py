"""zmq: the monitor socket and XPUB subscriptions are read only when zmq says something is
there (``ZMQ_EVENTS``), so these prove that every event still gets through: a second peer on a
point-to-point channel, a broadcast rank out of range or present twice, a peer that leaves."""

from __future__ import annotations

import time

import pytest

import transports as T
from transports.errors import AddressError, TransportError


def _keep_sending(w: T.SyncWriter) -> None:
    """Send for up to ~5 s: the event under test reaches the writer asynchronously (monitor
    socket, subscriptions), and a send is where the writer reports it."""
    for _ in range(500):
        w.send(b"y", timeout=10)
        time.sleep(0.01)


def test_second_writer_on_point_to_point_is_an_error() -> None:
    r = T.open_reader("zmq", bind=True)
    w1 = T.open_writer(r.address, bind=False, connect_timeout=10)
    w1.send(b"one")
    assert bytes(r.recv(timeout=10).header) == b"one"
    w2 = T.open_writer(r.address, bind=False, connect_timeout=10)
    try:
        with pytest.raises(TransportError, match="a second peer connected"):
            for _ in range(200):
                try:
                    r.recv(timeout=0.05)
                except TimeoutError:
                    continue
    finally:
        for e in (w2, w1, r):
            e.close()


def test_broadcast_rank_out_of_range_is_an_error() -> None:
    w = T.open_broadcast_writer("zmq", 1)
    readers = [T.open_broadcast_reader(w.address, 0, connect_timeout=10)]
    try:
        w.send(b"x", timeout=10)
        assert bytes(readers[0].recv(timeout=10).header) == b"x"
        readers.append(T.open_broadcast_reader(w.address, 5, connect_timeout=10))
        with pytest.raises(AddressError, match=r"rank 5 connected to .* a broadcast to 1"):
            _keep_sending(w)
    finally:
        for e in (*readers, w):
            e.close()


def test_broadcast_rank_connected_twice_is_an_error() -> None:
    w = T.open_broadcast_writer("zmq", 2)
    readers = [T.open_broadcast_reader(w.address, 0, connect_timeout=10),
               T.open_broadcast_reader(w.address, 1, connect_timeout=10)]
    try:
        w.send(b"x", timeout=10)
        readers.append(T.open_broadcast_reader(w.address, 1, connect_timeout=10))
        with pytest.raises(AddressError, match="rank 1 connected twice"):
            _keep_sending(w)
    finally:
        for e in (*readers, w):
            e.close()


def test_broadcast_reader_leaving_is_peer_closed_for_the_writer() -> None:
    w = T.open_broadcast_writer("zmq", 2)
    r0 = T.open_broadcast_reader(w.address, 0, connect_timeout=10)
    r1 = T.open_broadcast_reader(w.address, 1, connect_timeout=10)
    try:
        w.send(b"x", timeout=10)
        r1.close()
        with pytest.raises(T.PeerClosedError, match="is gone"):
            _keep_sending(w)
    finally:
        for e in (r0, w):
            e.close()
