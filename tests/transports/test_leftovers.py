"""Nothing of a transport outlives its process: default addresses live in the abstract socket
namespace and shm rings in memfds, so a SIGKILLed binder leaves no socket file, directory or
segment in /tmp or /dev/shm. And only our own user gets through an abstract name."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import transports as T
from tests.runtime.leaks import LeakSnapshot
from tests.transports.peers import ROOT

# Binds every kind of default endpoint, connects one pair so that a ring or connection is
# really set up, prints the addresses and waits to be killed.
_BINDER = """
import sys, time
import transports as T
kind = sys.argv[1]
w = T.open_writer(kind)
r = T.open_reader(w.address)
w.send(b"set up", timeout=30)
assert bytes(r.recv(timeout=30).header) == b"set up"
bound = [T.open_reader(kind, bind=True), T.open_broadcast_writer(kind, 2)]
print("ready", w.address, *(e.address for e in bound), flush=True)
time.sleep(600)
"""


def _unix_socket_paths() -> dict[str, str]:
    """socket inode -> bound path ("@name" for abstract ones), from /proc/net/unix."""
    paths = {}
    with open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if len(cols) >= 8:
                paths[cols[6]] = cols[7]
    return paths


def _sockets_of(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    return inodes


def _mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {cols[5] for line in f if len(cols := line.split(maxsplit=5)) == 6}


def _temp_entries() -> set[str]:
    found: set[str] = set()
    for d in {"/tmp", tempfile.gettempdir(), "/dev/shm"}:
        with contextlib.suppress(OSError):
            found |= {os.path.join(d, n) for n in os.listdir(d)}
    return found


def _ours(entries: set[str], pid: int) -> list[str]:
    """The entries that a transport in process ``pid`` would have made."""
    return sorted(e for e in entries if os.path.basename(e).startswith("aiot-")
                  or f"{pid}-" in os.path.basename(e))


@pytest.mark.parametrize("kind", ["zmq", "shm", "uds"])
def test_a_sigkilled_binder_leaves_nothing_in_tmp_or_dev_shm(kind: str) -> None:
    before = _temp_entries()
    proc = subprocess.Popen([sys.executable, "-c", _BINDER, kind], stdout=subprocess.PIPE,
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", f"binder failed to start: {line}"
        addresses = line[1:]
        for address in addresses:  # the default names are abstract (shm names one as well)
            assert address.startswith(("zmq+ipc://@", "uds://@", "shm://")), address
        names = {p for inode, p in _unix_socket_paths().items()
                 if inode in _sockets_of(proc.pid) and p.startswith("@")}
        assert names, "the binder should be listening on abstract names"
        held = [p for inode, p in _unix_socket_paths().items()
                if inode in _sockets_of(proc.pid) and not p.startswith("@")]
        assert held == [], f"socket files on disk: {held}"
        # The interpreter's own libraries may live under /tmp (a checkout there); not ours.
        installed = (sys.prefix, sys.base_prefix, str(ROOT))
        mapped = [m for m in _mapped_files(proc.pid) if m.startswith(("/dev/shm", "/tmp"))
                  and not m.startswith(installed)]
        assert mapped == [], f"files mapped from /dev/shm or /tmp: {mapped}"
        assert _ours(_temp_entries() - before, proc.pid) == []
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    deadline = time.monotonic() + 30  # a hang guard: reaping can lag on a loaded box
    while names & set(_unix_socket_paths().values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel drops a dead process's names as it reaps its sockets
    assert not names & set(_unix_socket_paths().values())
    assert _ours(_temp_entries() - before, proc.pid) == []


_OTHER_USER = """
import os, socket, sys, time
import zmq
os.setgid(65534)
os.setuid(65534)
kind, address = sys.argv[1:3]
if kind == "zmq":
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(address)
    s.send(b"intruder")
    time.sleep(1.5)
    s.close(linger=0)
    ctx.term()
else:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\\0" + address.removeprefix("@"))
    s.listen()
    print("ready", flush=True)
    time.sleep(60)
"""


def _as_nobody(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _OTHER_USER, *args], stdout=subprocess.PIPE,
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True)


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a peer as nobody")


@needs_root
def test_a_zmq_abstract_name_refuses_another_user() -> None:
    r = T.open_reader("zmq", bind=True)
    address = r.address.removeprefix("zmq+")
    proc = _as_nobody("zmq", address)
    try:
        # It connected, sent and gave zmq 1.5 s to deliver before exiting cleanly...
        assert proc.wait(60) == 0
        with pytest.raises(TimeoutError):
            r.recv(timeout=1.0)  # ...but libzmq dropped its connection: nothing came through
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        r.close()


@needs_root
def test_uds_refuses_to_connect_to_another_users_abstract_name() -> None:
    name = f"@aiot-test-{os.getpid()}-other-user"
    proc = _as_nobody("uds", name)
    try:
        assert proc.stdout is not None and proc.stdout.readline().split() == ["ready"]
        with pytest.raises(T.AddressError, match="bound by a process of uid 65534"):
            T.open_writer(f"uds://{name}", bind=False, connect_timeout=10)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_leak_check_sees_a_transport_directory_left_in_the_temp_dir() -> None:
    """What a SIGKILLed binder of an explicit path (or an old default) can leave: the autouse
    leak check now reports and removes ``aiot-*`` entries, not only ``aioengine-*`` ones."""
    snapshot = LeakSnapshot()
    left = tempfile.mkdtemp(prefix="aiot-zmq-leaktest-")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.path.join(left, "s"))  # a socket file whose owner is gone once closed
    finally:
        sock.close()
    problems = snapshot.finish(grace=0)
    assert f"left behind: {left}" in problems
    assert not os.path.exists(left)
