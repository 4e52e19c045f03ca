"""Addresses and their security for the socket transports (uds, zmq): abstract default names,
private explicit files removed on every exit path, loopback TCP, clear errors for unusable
addresses."""

from __future__ import annotations

import gc
import os
import stat
import tempfile

import pytest

import transports as T
from tests.transports.conftest import run


def _path(url: str) -> str:
    return url.split("://", 1)[1].removeprefix("ipc://")


def _temp_entries() -> set[str]:
    """Entries of /tmp and of the temp dir (an xdist worker's own one under the test command)."""
    return {os.path.join(d, n) for d in {"/tmp", tempfile.gettempdir()} for n in os.listdir(d)}


def _abstract_names() -> set[str]:
    with open("/proc/net/unix") as f:
        return {cols[7] for line in f.readlines()[1:]
                if len(cols := line.split()) >= 8 and cols[7].startswith("@")}


@pytest.mark.parametrize("name", ["uds", "zmq"])
def test_default_address_is_an_abstract_name_gone_with_close(name: str) -> None:
    """Nothing on disk, so nothing to remove on any exit path (see test_leftovers.py for
    SIGKILL); the kernel drops the name with the socket."""
    before = _temp_entries()
    w = T.open_writer(name)
    path = _path(w.address)
    try:
        assert path.startswith("@aiot-"), w.address
        assert path in _abstract_names()
        r = T.open_reader(w.address)
        w.send(b"x")
        assert bytes(r.recv(timeout=10).header) == b"x"
        r.close()
        assert not {p for p in _temp_entries() - before if os.path.basename(p).startswith("aiot-")}
    finally:
        w.close()
    assert path not in _abstract_names()


@pytest.mark.parametrize("scheme", ["uds://", "zmq+ipc://"])
def test_explicit_socket_file_removed_when_endpoint_is_garbage_collected(scheme: str,
                                                                        tmp_path) -> None:
    path = str(tmp_path / "chan.sock")
    w = T.open_writer(f"{scheme}{path}")
    assert os.path.exists(path)
    del w
    gc.collect()
    assert not os.path.exists(path)


@pytest.mark.parametrize("scheme", ["uds://", "zmq+ipc://"])
def test_explicit_path_is_0600_and_removed(scheme: str, tmp_path) -> None:
    path = str(tmp_path / "chan.sock")
    w = T.open_writer(f"{scheme}{path}")
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        w.close()
    assert not os.path.exists(path)


@pytest.mark.parametrize("scheme", ["uds://@", "zmq+ipc://@"])
def test_abstract_names_leave_nothing_on_disk(scheme: str, tmp_path) -> None:
    name = f"aiot-test-{os.getpid()}-{scheme[:3]}"
    before = _temp_entries()
    w = T.open_writer(f"{scheme}{name}")
    r = T.open_reader(w.address)
    try:
        w.send(b"abstract")
        assert bytes(r.recv(timeout=10).header) == b"abstract"
        # Only names with ours in them: another test run (an xdist worker) may use /tmp too.
        assert not {p for p in _temp_entries() - before if "aiot-" in os.path.basename(p)}
    finally:
        w.close()
        r.close()


@pytest.mark.parametrize("scheme", ["uds://", "zmq+ipc://"])
def test_path_too_long_is_an_address_error(scheme: str) -> None:
    with pytest.raises(T.AddressError, match="at most 107"):
        T.open_writer(f"{scheme}/tmp/{'x' * 200}")


def test_uds_address_in_use_and_stale_file(tmp_path) -> None:
    path = str(tmp_path / "s")
    w = T.open_writer(f"uds://{path}")
    try:
        with pytest.raises(T.AddressError, match="already in use"):
            T.open_writer(f"uds://{path}")
    finally:
        w.close()
    # A file left by a killed owner (nobody listening) is replaced.
    import socket

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()
    w = T.open_writer(f"uds://{path}")
    w.close()
    assert not os.path.exists(path)


def test_zmq_tcp_binds_loopback_with_a_real_port() -> None:
    w = T.open_writer("zmq+tcp://127.0.0.1:0")
    r = T.open_reader(w.address)
    try:
        host, port = w.address.removeprefix("zmq+tcp://").rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        w.send(b"over tcp", [bytes(100_000)])
        msg = r.recv(timeout=10)
        assert bytes(msg.header) == b"over tcp" and len(msg.buffers[0]) == 100_000
    finally:
        w.close()
        r.close()
    w = T.open_writer("zmq+tcp://localhost:0")
    try:
        assert w.address.startswith("zmq+tcp://127.0.0.1:")
    finally:
        w.close()


@pytest.mark.parametrize("url, match", [
    ("zmq+tcp://127.0.0.1:99999", "out of range"),
    ("zmq+tcp://127.0.0.1:http", "not a number"),
    ("zmq+tcp://example.com:0", "must be an IP address"),
    ("zmq+udp://x", "not supported"),
    ("zmq://x", "need a wire"),
    ("uds://", "empty socket path"),
    ("uds:///no/such/dir/s", "does not exist"),
    ("uds:///etc/hostname", "not a socket"),
    ("zmq+ipc:///etc/hostname", "not a socket"),
])
def test_bad_urls_name_the_problem(url: str, match: str) -> None:
    with pytest.raises(T.AddressError, match=match):
        T.open_writer(url)


@pytest.mark.parametrize("name", ["uds", "zmq"])
def test_connecting_needs_an_address_and_times_out_clearly(name: str, tmp_path) -> None:
    with pytest.raises(T.AddressError, match="needs the binder's address"):
        T.open_reader(name)
    url = f"uds://{tmp_path}/none" if name == "uds" else f"zmq+ipc://{tmp_path}/none"
    with pytest.raises(TimeoutError, match="could not connect"):
        T.open_reader(url, connect_timeout=0.3)


@pytest.mark.parametrize("name", ["uds", "zmq"])
def test_binder_first_send_bounded_by_connect_timeout(name: str) -> None:
    w = T.open_writer(name, connect_timeout=0.3)
    try:
        with pytest.raises(TimeoutError, match="connect_timeout"):
            w.send(b"nobody listens")
    finally:
        w.close()


def test_uds_broadcast_refuses_a_bad_rank_with_the_reason() -> None:
    w = T.open_broadcast_writer("uds", 2)
    good = T.open_broadcast_reader(w.address, 0)
    bad = T.open_broadcast_reader(w.address, 5)
    late = None
    try:
        with pytest.raises(TimeoutError):
            w.send(b"x", timeout=0.5)  # rank 5 was refused, rank 1 is still missing
        with pytest.raises(T.AddressError, match="rank 5 is out of range"):
            bad.recv(timeout=10)
        late = T.open_broadcast_reader(w.address, 1)
        w.send(b"x", timeout=10)
        assert bytes(good.recv(timeout=10).header) == b"x"
        assert bytes(late.recv(timeout=10).header) == b"x"
    finally:
        for e in (w, good, bad, late):
            if e is not None:
                e.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_uds_refused_writer_is_told_the_binders_reason(mode: str) -> None:
    """A writer connecting where a writer is bound is refused; both flavours report the
    binder's reason (not just "gone") on their next send, and stay broken after it."""
    binder = T.open_writer("uds")
    expected = "refused the connection: a writer connected, but this endpoint expects a reader"

    def refuse() -> None:
        with pytest.raises(TimeoutError):  # accepts (and refuses) ours; no reader ever comes
            binder.send(b"x", timeout=0.5)

    try:
        if mode == "sync":
            w = T.open_writer(binder.address, bind=False)
            try:
                refuse()
                for _ in range(2):
                    with pytest.raises(T.PeerClosedError, match=expected):
                        w.send(b"y", timeout=5)
            finally:
                w.close()
        else:
            async def body() -> None:
                aw = await T.open_async_writer(binder.address, bind=False)
                try:
                    refuse()
                    for _ in range(2):
                        with pytest.raises(T.PeerClosedError, match=expected):
                            await aw.send(b"y", timeout=5)
                finally:
                    aw.close()
            run(body())
    finally:
        binder.close()


def test_zmq_broadcast_reports_a_bad_rank() -> None:
    w = T.open_broadcast_writer("zmq", 1)
    bad = T.open_broadcast_reader(w.address, 3)
    try:
        with pytest.raises(T.AddressError, match="rank 3"):
            w.send(b"x", timeout=5)
    finally:
        w.close()
        bad.close()


def test_reader_binds_and_writer_connects() -> None:
    for name in ("uds", "zmq"):
        r = T.open_reader(name, bind=True)
        w = T.open_writer(r.address, bind=False)
        try:
            w.send(b"reverse roles")
            assert bytes(r.recv(timeout=10).header) == b"reverse roles"
        finally:
            w.close()
            r.close()
