"""Every bad input to the shm transport gets a specific error naming the cause, and the
endpoint stays usable after a rejected call."""

from __future__ import annotations

import asyncio
import socket

import pytest

import transports
from transports import AddressError, shm
from transports.shm.address import MAX_NAME


@pytest.mark.parametrize(("address", "match"), [
    ("", "empty shm channel name"),
    ("shm://", "empty shm channel name"),
    ("/tmp/ring", "only hold letters"),
    ("a b", "only hold letters"),
    ("x" * (MAX_NAME + 1), "at most"),
    (42, "must be a str"),
])
def test_bad_addresses(address, match):
    with pytest.raises(AddressError, match=match):
        shm.open_writer(address)
    with pytest.raises(AddressError, match=match):
        shm.open_reader(address, bind=True)


def test_bad_urls_through_the_factory():
    with pytest.raises(AddressError, match="empty shm channel name"):
        transports.open_writer("shm://")
    with pytest.raises(AddressError, match="only hold letters"):
        transports.open_reader("shm://a/b", bind=True)
    with transports.open_writer("shm", capacity=8192) as w:
        assert w.address.startswith("shm://")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"capacity": True}, TypeError, "capacity must be an int"),
    ({"capacity": 1.5}, TypeError, "capacity must be an int"),
    ({"capacity": 100}, ValueError, "capacity must be between"),
    ({"capacity": 2**41}, ValueError, "capacity must be between"),
    ({"bind": "yes"}, TypeError, "bind must be True or False"),
    ({"connect_timeout": -1}, ValueError, "connect_timeout must be >= 0"),
    ({"connect_timeout": "soon"}, TypeError, "connect_timeout must be a number"),
])
def test_bad_open_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        shm.open_writer(None, **kwargs)
    with pytest.raises(error, match=match):
        asyncio.run(shm.open_async_reader(None, **{"bind": True, **kwargs}))


def test_bad_broadcast_arguments():
    with pytest.raises(ValueError, match="num_readers must be between 1"):
        shm.open_broadcast_writer(None, 0)
    with pytest.raises(TypeError, match="num_readers must be an int"):
        shm.open_broadcast_writer(None, "2")
    with pytest.raises(ValueError, match="rank must be between 0"):
        shm.open_broadcast_reader("shm://x", -1)
    with pytest.raises(TypeError, match="rank must be an int"):
        shm.open_broadcast_reader("shm://x", True)
    with pytest.raises(ValueError, match="needs the writer's address"):
        shm.open_broadcast_reader(None, 0)


def test_rank_out_of_range_or_taken_is_refused_with_the_reason():
    with shm.open_broadcast_writer(None, 2, capacity=8192) as w, \
            shm.open_broadcast_reader(w.address, 5) as bad, \
            shm.open_broadcast_reader(w.address, 0) as r0, \
            shm.open_broadcast_reader(w.address, 1) as r1:
        w.send(b"hello", timeout=5)  # admits 0 and 1, refuses 5
        with pytest.raises(AddressError, match="rank 5 is out of range"):
            bad.recv(timeout=5)
        assert r0.recv(timeout=5).header == b"hello" == r1.recv(timeout=5).header
    with shm.open_broadcast_writer(None, 1, capacity=8192) as w, \
            shm.open_broadcast_reader(w.address, 0) as first:
        w.send(b"one", timeout=5)
        assert first.recv(timeout=5).header == b"one"
    with shm.open_broadcast_writer(None, 2, capacity=8192) as w, \
            shm.open_broadcast_reader(w.address, 0) as a, \
            shm.open_broadcast_reader(w.address, 0) as b:
        with pytest.raises(TimeoutError):
            w.send(b"x", timeout=0.3)
        errors = []
        for r in (a, b):
            try:
                r.recv(timeout=0.3)
            except (AddressError, TimeoutError) as e:
                errors.append(e)
        assert any(isinstance(e, AddressError) and "rank 0 is already connected" in str(e)
                   for e in errors)


def test_bad_messages_are_refused_and_the_endpoint_stays_usable():
    with shm.open_writer(None, capacity=4096) as w, shm.open_reader(w.address) as r:
        with pytest.raises(TypeError, match="header must be bytes"):
            w.send("text")
        with pytest.raises(TypeError, match="buffers must be a sequence"):
            w.send(b"h", b"not a list")
        with pytest.raises(TypeError, match=r"buffers\[1\] must be bytes"):
            w.send(b"h", [b"ok", 3])
        with pytest.raises(ValueError, match="at most 1000 buffers"):
            w.send(b"h", [b""] * 1001)
        with pytest.raises(ValueError, match="use fewer buffers or a larger capacity"):
            w.send(b"h", [b""] * 600)
        with pytest.raises(ValueError, match="timeout must be >= 0"):
            w.send(b"h", timeout=-1)
        with pytest.raises(TypeError, match="timeout must be a number"):
            r.recv(timeout="1")
        with pytest.raises(ValueError, match="timeout must be >= 0"):
            r.recv(timeout=float("nan"))
        w.send(b"fine", [b"still", memoryview(b"a-c-e-")[::2]], timeout=5)
        m = r.recv(timeout=5)  # a strided view travels as its logical bytes
        assert (bytes(m.header), [bytes(b) for b in m.buffers]) == (b"fine", [b"still", b"ace"])


def test_name_in_use_and_nothing_bound():
    with shm.open_writer(None) as w, pytest.raises(AddressError, match="already bound"):
        shm.open_reader(w.address, bind=True)
    with pytest.raises(TimeoutError, match=r"nothing is bound at shm://.*connect_timeout"):
        shm.open_reader("shm://nobody-binds-this", connect_timeout=0.2)
    with pytest.raises(TimeoutError, match="nothing is bound"):
        asyncio.run(shm.open_async_writer("shm://nobody-binds-this", bind=False,
                                          connect_timeout=0.2))


def test_binder_waits_for_its_peer_only_until_connect_timeout():
    with shm.open_reader(None, bind=True, connect_timeout=1) as r:
        with pytest.raises(TimeoutError, match=r"recv on .* timed out after 0.05 s"):
            r.recv(timeout=0.05)
        with pytest.raises(TimeoutError, match=r"no writer connected .* within 1.0 s"):
            r.recv(timeout=5)
    with shm.open_writer(None, connect_timeout=0.3) as w, \
            pytest.raises(TimeoutError, match=r"0 of 1 reader\(s\) connected .* missing"):
        w.send(b"x", timeout=5)


def test_a_garbage_peer_is_dropped_and_the_real_one_still_gets_in():
    with shm.open_writer(None, capacity=8192) as w:
        junk = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        junk.connect("\0aioengine-shm-" + w.address.removeprefix("shm://"))
        junk.send(b"GET / HTTP/1.0\r\n\r\n")
        with shm.open_reader(w.address) as r:
            w.send(b"real", timeout=5)
            assert r.recv(timeout=5).header == b"real"
        assert junk.recv(16) == b""  # dropped without an answer
        junk.close()
