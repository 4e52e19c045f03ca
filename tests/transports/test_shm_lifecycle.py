"""shm endpoints' lifecycle: peer death (SIGKILL included) within 1 s, close() waking waiters,
cancellation losing nothing, and nothing left behind (fds, names, /dev/shm)."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.transports.shm_peers import Peers
from transports import AddressError, ChannelClosedError, PeerClosedError, shm


@pytest.fixture
def peers() -> Iterator[Peers]:
    p = Peers()
    yield p
    p.close()


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def abstract_names() -> str:
    with open("/proc/net/unix") as f:
        return f.read()


def listening(name: str) -> bool:
    """Whether a socket listens on shm name ``name`` (accepted sockets show the name too)."""
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(len(r) == 8 and r[7] == "@aioengine-shm-" + name and r[3] == "00010000"
               for r in rows)


# Death and close are seen event-driven (POLLHUP, eventfd; the writer's liveness look is at
# most 0.1 s apart): ms on an idle box, and the contract says 1 s. The failure mode is a call
# that only ends when its timeout does, so those wait 60 s (or forever) and the bound is 10 s:
# room for a loaded box (2 hogged cores), still far below what a blind call would wait.
SEEN_BOUND = 10.0


def kill_later(proc: subprocess.Popen[str], delay: float) -> list[float]:
    """SIGKILL ``proc`` after ``delay`` s from a thread; the list receives the kill time."""
    when: list[float] = []

    def run() -> None:
        time.sleep(delay)
        when.append(time.monotonic())
        proc.send_signal(signal.SIGKILL)

    threading.Thread(target=run, daemon=True).start()
    return when


def test_writer_waiting_for_space_sees_a_killed_reader_within_1s(peers):
    with shm.open_writer(None, capacity=4096) as w:
        proc = peers.spawn("hang-reader", w.address)
        w.send(b"first", timeout=30)
        with pytest.raises(TimeoutError):
            while True:  # fill the ring: the reader no longer reads
                w.send(b"." * 256, timeout=0.05)
        killed = kill_later(proc, 0.2)
        with pytest.raises(PeerClosedError, match="reader 0"):
            w.send(b"." * 256, timeout=60)
        assert time.monotonic() - killed[0] < SEEN_BOUND
        with pytest.raises(PeerClosedError):  # and it stays broken
            w.send(b"again")


def test_reader_waiting_for_data_sees_a_killed_writer_within_1s(peers):
    """The binding writer is SIGKILLed: what it wrote is still delivered, then the waiting
    reader raises PeerClosedError; the name is free again (nothing of it survives)."""
    name = f"shm://killed-writer-{os.getpid()}"
    proc = peers.spawn("hang-writer", name)
    with shm.open_reader(name) as r:
        m = r.recv(timeout=30)
        assert (bytes(m.header), bytes(m.buffers[0])) == (b"first",
                                                           b"still readable after my death")
        killed = kill_later(proc, 0.2)
        with pytest.raises(PeerClosedError, match="disconnected"):
            r.recv(timeout=60)
        assert time.monotonic() - killed[0] < SEEN_BOUND
    proc.wait()
    assert name.removeprefix("shm://") not in abstract_names()
    with shm.open_writer(name):  # rebinding works: the creator's socket died with it
        pass


def test_async_reader_sees_a_killed_writer_within_1s(peers):
    name = f"shm://killed-async-{os.getpid()}"
    proc = peers.spawn("hang-writer", name)

    async def main() -> float:
        r = await shm.open_async_reader(name)
        try:
            assert bytes((await r.recv(timeout=30)).header) == b"first"
            killed = kill_later(proc, 0.2)
            with pytest.raises(PeerClosedError):
                await r.recv(timeout=60)
            return time.monotonic() - killed[0]
        finally:
            r.close()

    assert asyncio.run(main()) < SEEN_BOUND


def test_clean_close_is_seen_after_the_last_message():
    with shm.open_writer(None, capacity=8192) as w, shm.open_reader(w.address) as r:
        w.send(b"one")
        w.send(b"two", [b"x" * 6000])  # streams: more than half the ring
        w.close()
        assert bytes(r.recv(timeout=5).header) == b"one"
        assert bytes(r.recv(timeout=5).buffers[0]) == b"x" * 6000
        with pytest.raises(PeerClosedError, match="closed"):
            r.recv(timeout=5)
        with pytest.raises(ChannelClosedError):
            w.send(b"after close")
    with shm.open_writer(None) as w, shm.open_reader(w.address) as r:
        w.send(b"hello")
        r.recv(timeout=5)
        r.close()
        with pytest.raises(PeerClosedError, match="closed its end"):
            w.send(b"nobody listens", timeout=5)


@pytest.mark.parametrize("side", ["reader", "writer"])
def test_close_from_another_thread_wakes_a_blocked_call(side):
    with shm.open_writer(None, capacity=4096) as w, shm.open_reader(w.address) as r:
        w.send(b"hello")
        r.recv(timeout=5)
        if side == "writer":
            with pytest.raises(TimeoutError):
                while True:
                    w.send(b"." * 500, timeout=0.05)
        endpoint = r if side == "reader" else w
        errors: list[BaseException] = []

        def blocked() -> None:
            try:
                if side == "reader":
                    r.recv()
                else:
                    w.send(b"." * 500)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.2)
        assert t.is_alive()
        start = time.monotonic()
        endpoint.close()
        t.join(60)  # a hang guard: the blocked call has no timeout of its own
        assert not t.is_alive() and time.monotonic() - start < SEEN_BOUND
        assert len(errors) == 1 and isinstance(errors[0], ChannelClosedError)


def test_async_cancel_loses_no_message_and_close_wakes_the_waiter():
    async def main() -> None:
        w = await shm.open_async_writer(None, capacity=8192)
        r = await shm.open_async_reader(w.address)
        try:
            await w.send(b"first")
            assert bytes((await r.recv(timeout=5)).header) == b"first"
            pending = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0.05)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
            await w.send(b"second", [b"payload"])
            m = await r.recv(timeout=5)
            assert (bytes(m.header), bytes(m.buffers[0])) == (b"second", b"payload")
            with pytest.raises(TimeoutError):
                await r.recv(timeout=0.05)
            waiter = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0.05)
            r.close()
            with pytest.raises(ChannelClosedError):
                await asyncio.wait_for(waiter, 5)
        finally:
            w.close()
            r.close()

    asyncio.run(main())


def test_async_writer_blocks_on_a_full_ring_and_resumes(peers):
    """An async writer streams through an async-side-agnostic peer: the spawned echo peer is
    a blocking reader/writer; here both parent ends are async."""
    async def main() -> None:
        w = await shm.open_async_writer(None, capacity=4096)
        r = await shm.open_async_reader(None, bind=True)
        try:
            proc = peers.spawn("echo", w.address, r.address)
            msgs = [(bytes([i]) * (i * 300), [bytes([i]) * 5000]) for i in range(20)]

            async def produce() -> None:
                for header, buffers in msgs:
                    await w.send(header, buffers, timeout=30)

            task = asyncio.ensure_future(produce())
            for header, buffers in msgs:
                m = await r.recv(timeout=30)
                assert (bytes(m.header), [bytes(b) for b in m.buffers]) == (header, buffers)
            await task
            w.close()
            await asyncio.get_running_loop().run_in_executor(None, peers.join, proc)
        finally:
            w.close()
            r.close()

    asyncio.run(main())


def ours_in_dev_shm() -> set[str]:
    """/dev/shm entries with our names (the rest of it is the machine's: another test run, an
    xdist worker's semaphores)."""
    return {n for n in os.listdir("/dev/shm") if "aioengine" in n or "aiot" in n}


def test_endpoints_leave_no_fd_no_name_and_nothing_in_dev_shm():
    before_fds, before_shm = open_fds(), ours_in_dev_shm()
    with shm.open_broadcast_writer(None, 2, capacity=64 * 1024) as w:
        name = w.address.removeprefix("shm://")
        assert listening(name)
        readers = [shm.open_broadcast_reader(w.address, rank) for rank in range(2)]
        w.send(b"x", [b"y" * 10000])
        for r in readers:
            assert bytes(r.recv(timeout=5).buffers[0]) == b"y" * 10000
        # Everyone is connected: the listening name is gone already.
        assert not listening(name)
        assert ours_in_dev_shm() == before_shm
        for r in readers:
            r.close()
    assert open_fds() == before_fds
    assert "@aioengine-shm-" + name not in abstract_names()
    assert ours_in_dev_shm() == before_shm


def memfd_links() -> list[int]:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:aioengine-shm-"):
                fds.append(int(fd))
        except FileNotFoundError:  # the fd listdir itself used
            pass
    return fds


def test_segment_is_a_sealed_memfd_the_peer_cannot_resize():
    gc.collect()  # mappings that earlier tests' received views kept alive
    before = set(memfd_links())
    with shm.open_writer(None, capacity=8192) as w, shm.open_reader(w.address) as r:
        w.send(b"hi")
        r.recv(timeout=5)
        # The mappings' own fds (mmap keeps a dup) are memfds: no file in any filesystem.
        fds = sorted(set(memfd_links()) - before)
        assert len(fds) == 2  # the writer's mapping and the reader's
        with pytest.raises(PermissionError):
            os.ftruncate(fds[0], 4096)
        seals = fcntl.fcntl(fds[0], fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
    assert set(memfd_links()) == before


def test_views_held_past_close_keep_the_mapping_until_dropped():
    """close() never unmaps memory a caller still looks at: the mapping lives on until the
    last received view is dropped, then goes."""
    gc.collect()
    before = set(memfd_links())
    w = shm.open_writer(None, capacity=8192)
    r = shm.open_reader(w.address)
    w.send(b"kept")
    m = r.recv(timeout=5)
    w.close()
    r.close()
    assert bytes(m.header) == b"kept"
    assert len(set(memfd_links()) - before) == 1  # only the reader's mapping survives
    del m
    gc.collect()
    assert set(memfd_links()) == before


SYSTEM_PYTHON = "/usr/bin/python3"
FOREIGN_BINDER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind("\\0aioengine-shm-" + sys.argv[1])
s.listen(4)
print("ready", flush=True)
time.sleep(60)
"""
FOREIGN_READER = """
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect("\\0aioengine-shm-" + sys.argv[1])
try:
    s.send(struct.pack("<8sBBHIQI", b"AIOSHM01", 1, 1, 0, 0, 0, 0))
    data, fds, _, _ = socket.recv_fds(s, 1024, 4)
except (BrokenPipeError, ConnectionResetError):
    data, fds = b"", []
sys.exit(10 + len(fds) + len(data))
"""


def run_as_nobody(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([SYSTEM_PYTHON, "-c", code, *args], user=65534, cwd="/",
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.skipif(os.getuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                    reason="needs root and a system python to run a peer as another user")
def test_processes_of_another_user_get_nothing():
    """Abstract sockets have no permissions, so both sides check SO_PEERCRED: we never
    connect to another user's name, and never hand our ring to another user's process."""
    name = f"foreign-{os.getpid()}"
    squatter = run_as_nobody(FOREIGN_BINDER, name)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
        with pytest.raises(AddressError, match="uid 65534, not ours"):
            shm.open_reader(f"shm://{name}", connect_timeout=5)
        with pytest.raises(AddressError, match="uid 65534, not ours"):
            shm.open_writer(f"shm://{name}", bind=False, connect_timeout=5)
    finally:
        squatter.kill()
        squatter.wait()
        squatter.stdout.close()
    with shm.open_writer(f"shm://{name}") as w:
        intruder = run_as_nobody(FOREIGN_READER, name)
        with pytest.raises(TimeoutError, match="0 of 1"):
            w.send(b"secret", timeout=1)  # accepts the connection and drops it
        assert intruder.wait(30) == 10  # it got neither bytes nor file descriptors
        intruder.stdout.close()


def test_two_readers_or_two_writers_on_one_name_are_refused():
    with shm.open_reader(None, bind=True) as r1, shm.open_reader(r1.address) as r2:
        with pytest.raises(TimeoutError):
            r1.recv(timeout=0.2)  # admits r2's connection and refuses it
        with pytest.raises(AddressError, match="one side must write"):
            r2.recv(timeout=5)
    with shm.open_writer(None) as w1, shm.open_writer(w1.address, bind=False) as w2:
        with pytest.raises(TimeoutError):
            w1.send(b"x", timeout=0.2)
        deadline = time.monotonic() + 5
        with pytest.raises(AddressError, match="one side must read"):
            while time.monotonic() < deadline:
                w2.send(b"y", timeout=1)
                time.sleep(0.05)
