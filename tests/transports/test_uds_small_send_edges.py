"""uds: the sync writer's small-send fast path against the general path's edge cases, with real
sockets and threads: the same errors (type and text) when the reader is gone, a binding writer
sending before its reader connects, a broadcast writer of one reader, close() from another
thread while a small frame waits for room, and concurrent writers whose frames never interleave."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

import transports as T
from transports.errors import ChannelClosedError, PeerClosedError


def _pair(capacity: int | None = None) -> tuple[T.SyncReader, T.SyncWriter]:
    extra = {} if capacity is None else {"capacity": capacity}
    r = T.open_reader("uds", bind=True, **extra)
    w = T.open_writer(r.address, bind=False, connect_timeout=10, **extra)
    return r, w


def _gone_error(header: bytes | bytearray, unread: bool) -> str:
    """The error a send of ``header`` raises once its reader closed (with or without frames it
    never read), the address replaced so two channels compare."""
    r, w = _pair()
    try:
        w.send(b"first")
        if not unread:
            assert bytes(r.recv(timeout=10).header) == b"first"
        r.close()
        with pytest.raises(PeerClosedError) as info:
            for _ in range(1000):
                w.send(header)
                time.sleep(0.001)
        with pytest.raises(PeerClosedError) as again:  # and the writer stays broken
            w.send(header)
        assert str(again.value) == str(info.value)
        return str(info.value).replace(w.address, "ADDR")
    finally:
        w.close()
        r.close()


@pytest.mark.parametrize("unread", [False, True], ids=["all-read", "unread-left"])
def test_a_gone_reader_is_the_same_error_on_both_paths(unread: bool) -> None:
    fast = _gone_error(b"small", unread)
    general = _gone_error(bytearray(b"small"), unread)  # not bytes: the general path
    assert fast == general
    assert re.fullmatch(r"the reader of ADDR is gone \(.+\)", fast), fast


def test_a_binding_writer_waits_for_its_reader_then_sends_small_frames() -> None:
    w = T.open_writer("uds", bind=True, connect_timeout=10)
    r: T.SyncReader | None = None
    errors: list[BaseException] = []

    def send() -> None:
        try:
            for i in range(50):
                w.send(f"m{i}".encode())
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    t = threading.Thread(target=send)
    try:
        t.start()
        time.sleep(0.2)
        assert t.is_alive(), "the first send did not wait for a reader"
        r = T.open_reader(w.address, bind=False, connect_timeout=10)
        assert [bytes(r.recv(timeout=10).header) for _ in range(50)] == [
            f"m{i}".encode() for i in range(50)]
        t.join(10)
        assert not errors
    finally:
        w.close()
        t.join(10)
        if r is not None:
            r.close()


def test_a_binding_writer_nobody_joins_times_out_as_before() -> None:
    w = T.open_writer("uds", bind=True, connect_timeout=0.3)
    try:
        with pytest.raises(TimeoutError, match=r"only 0 of 1 reader\(s\) connected"):
            w.send(b"small")
    finally:
        w.close()


def test_a_broadcast_writer_of_one_reader_sends_small_frames_and_sees_it_leave() -> None:
    w = T.open_broadcast_writer("uds", 1, connect_timeout=10)
    r = T.open_broadcast_reader(w.address, 0, connect_timeout=10)
    try:
        for i in range(20):
            w.send(f"b{i}".encode())
        assert [bytes(r.recv(timeout=10).header) for _ in range(20)] == [
            f"b{i}".encode() for i in range(20)]
        r.close()
        with pytest.raises(PeerClosedError, match=r"the reader rank 0 of .* is gone"):
            for _ in range(1000):
                w.send(b"after")
                time.sleep(0.001)
    finally:
        w.close()
        r.close()


@pytest.mark.parametrize("header", [b"x" * 60_000, bytearray(b"x" * 60_000)],
                         ids=["fast", "general"])
def test_close_from_another_thread_ends_a_send_waiting_for_room(header) -> None:
    r, w = _pair(capacity=4096)
    raised: list[BaseException] = []

    def send() -> None:
        try:
            for _ in range(100):  # nobody reads: one of these waits for room
                w.send(header)
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=send)
    try:
        t.start()
        time.sleep(0.3)
        assert t.is_alive(), "60 KB frames into a 4 KiB channel did not block"
        start = time.monotonic()
        w.close()
        # A hang guard (the send has no timeout of its own); the close wakes it event-driven,
        # ms on an idle box: 10 s leaves a loaded box (2 hogged cores) room.
        t.join(60)
        assert not t.is_alive() and time.monotonic() - start < 10
        assert len(raised) == 1 and isinstance(raised[0], ChannelClosedError), raised
    finally:
        w.close()
        t.join(10)
        r.close()


def test_concurrent_small_and_general_senders_never_interleave_frames() -> None:
    r, w = _pair(capacity=4096)
    per_thread = 200

    def frames(k: int) -> list[bytes]:
        return [bytes([k]) * (1 + (i * 389 + k * 1000) % 70_000) for i in range(per_thread)]

    def send(k: int) -> None:
        for i, f in enumerate(frames(k)):
            if i % 5 == 0:
                w.send(bytearray(f))
            elif i % 7 == 0:
                w.send(f[:1], [f[1:]] if len(f) > 1 else [], timeout=30)
            else:
                w.send(f)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(1, 5)]
    try:
        for t in threads:
            t.start()
        got: dict[int, list[bytes]] = {k: [] for k in range(1, 5)}
        for _ in range(4 * per_thread):
            msg = r.recv(timeout=30)
            whole = bytes(msg.header) + b"".join(bytes(b) for b in msg.buffers)
            assert whole and whole == bytes([whole[0]]) * len(whole), "frames interleaved"
            got[whole[0]].append(whole)
        for k in range(1, 5):
            assert got[k] == frames(k)  # each thread's frames whole and in its order
    finally:
        for t in threads:
            t.join(30)
        w.close()
        r.close()


SIGPIPE_HOST = """
import signal, sys, time
sys.path.insert(0, sys.argv[1])
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a host that did not ignore SIGPIPE
import transports as T
from transports.errors import PeerClosedError
r = T.open_reader("uds", bind=True)
w = T.open_writer(r.address, bind=False, connect_timeout=10)
w.send(b"x")
r.close()
try:
    for _ in range(1000):
        w.send(b"small")  # the fast path's own send(2) must not raise SIGPIPE
        time.sleep(0.001)
except PeerClosedError as exc:
    print("peer closed:", exc)
w.close()
"""


def test_a_small_send_to_a_gone_reader_raises_no_sigpipe() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", SIGPIPE_HOST, root], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert "peer closed: the reader of" in proc.stdout
