"""uds addresses: parsing, binding a private listening socket, connecting with retry, and the
hello/reply frames that tell the binder who connected (role, broadcast rank) and let it refuse
a wrong peer with a reason instead of a bare hang-up."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import time
from dataclasses import dataclass

from transports._deadline import Deadline
from transports._paths import FileCleanup, abstract_name, check_not_other_file, check_unix_path
from transports.errors import AddressError

READER, WRITER = 1, 2
ROLE_NAMES = {READER: "reader", WRITER: "writer"}
_HELLO = struct.Struct("<4sBBi")  # magic, version, role, rank (-1: point-to-point)
_MAGIC = b"AIOT"
_VERSION = 1
OK_REPLY = b"AIOK"
ERR_REPLY = b"AIER"
SNDBUF_MAX = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class UdsAddress:
    path: str  # a filesystem path, or "@name" for the abstract namespace

    @property
    def url(self) -> str:
        return f"uds://{self.path}"

    @property
    def sockaddr(self) -> str | bytes:
        return b"\0" + self.path[1:].encode() if self.path.startswith("@") else self.path


def parse(address: str | None, *, binding: bool) -> UdsAddress:
    if address is None:
        if not binding:
            raise AddressError("the connecting side needs the binder's address (uds://PATH), "
                               "not the short name 'uds'")
        return UdsAddress(abstract_name("aiot-uds-"))
    url = f"uds://{address}"
    if address.startswith("@"):
        check_unix_path(address, url)
        return UdsAddress(address)
    if not address:
        raise AddressError(f"empty socket path in {url!r}")
    path = os.path.abspath(address)
    check_unix_path(path, url)
    return UdsAddress(path)


def listen(addr: UdsAddress, backlog: int, owner: object) -> tuple[socket.socket, FileCleanup]:
    """Bind and listen; the socket file is made 0600 at once and removed by the cleanup."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = None if addr.path.startswith("@") else addr.path
    if path is not None and os.path.exists(path):
        _remove_if_stale(path, addr.url)
    try:
        sock.bind(addr.sockaddr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise AddressError(f"{addr.url} is already in use by another endpoint") from e
        raise AddressError(f"cannot bind {addr.url}: {e.strerror or e}") from e
    cleanup = FileCleanup(owner, path)
    if path is not None:
        os.chmod(path, 0o600)
    sock.listen(max(backlog, 8))
    sock.setblocking(False)
    return sock, cleanup


def _remove_if_stale(path: str, url: str) -> None:
    """A socket file nobody listens on (its owner was SIGKILLed) may be replaced."""
    check_not_other_file(path, url)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError as e:
        raise AddressError(f"{url} exists and is not a usable socket: {e.strerror or e}") from e
    finally:
        probe.close()
    raise AddressError(f"{url} is already in use by another endpoint")


def _new_client_socket(capacity: int | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if capacity is not None:
        set_sndbuf(sock, capacity)
    return sock


def set_sndbuf(sock: socket.socket, capacity: int) -> None:
    # The kernel caps this at net.core.wmem_max; it bounds bytes queued in the kernel.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(4096, min(capacity, SNDBUF_MAX)))


def connect(addr: UdsAddress, deadline: Deadline, timeout: float,
            capacity: int | None) -> socket.socket:
    """Connect, retrying while the binder has not bound yet, until ``deadline``."""
    last: OSError | None = None
    while True:
        sock = _new_client_socket(capacity)
        try:
            sock.connect(addr.sockaddr)
            return _check_binder(sock, addr)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            last = e
        except OSError as e:
            sock.close()
            raise AddressError(f"cannot connect to {addr.url}: {e.strerror or e}") from e
        if deadline.expired():
            raise TimeoutError(f"could not connect to {addr.url} within {timeout} s "
                               f"(connect_timeout): {last.strerror or last}")
        time.sleep(0.01)


async def connect_async(addr: UdsAddress, deadline: Deadline, timeout: float,
                        capacity: int | None) -> socket.socket:
    """``connect`` for any event loop (asyncio or trio, through anyio): a non-blocking connect,
    retried while nothing is bound yet or the binder's backlog is full (EAGAIN: a Unix socket's
    connect never completes later). Returns a non-blocking socket."""
    import anyio

    last: OSError | None = None
    while True:
        sock = _new_client_socket(capacity)
        sock.setblocking(False)
        try:
            sock.connect(addr.sockaddr)
            return _check_binder(sock, addr)
        except (FileNotFoundError, ConnectionRefusedError, BlockingIOError) as e:
            sock.close()
            last = e
        except OSError as e:
            sock.close()
            raise AddressError(f"cannot connect to {addr.url}: {e.strerror or e}") from e
        except BaseException:
            sock.close()
            raise
        if deadline.expired():
            raise TimeoutError(f"could not connect to {addr.url} within {timeout} s "
                               f"(connect_timeout): {last.strerror or last}")
        await anyio.sleep(0.01)


def _check_binder(sock: socket.socket, addr: UdsAddress) -> socket.socket:
    """Talk only to a binder of our own user (an abstract name has no permissions to stop
    another user from binding one we were told about)."""
    uid = peer_uid(sock)
    if uid != os.getuid():
        sock.close()
        raise AddressError(f"{addr.url} is bound by a process of uid {uid}, not ours "
                           f"({os.getuid()}); refusing to connect")
    return sock


def hello(role: int, rank: int) -> bytes:
    return _HELLO.pack(_MAGIC, _VERSION, role, rank)


def check_hello(header: bytes, expect_role: int, num_readers: int | None,
                taken: set[int]) -> tuple[int, str | None]:
    """Return (rank, refusal reason or None) for a connector's hello frame."""
    if len(header) != _HELLO.size:
        return -1, "not an aioengine transport peer (bad hello)"
    magic, version, role, rank = _HELLO.unpack(header)
    if magic != _MAGIC:
        return -1, "not an aioengine transport peer (bad magic)"
    if version != _VERSION:
        return -1, f"protocol version {version} is not supported (expected {_VERSION})"
    if role != expect_role:
        return rank, (f"a {ROLE_NAMES.get(role, role)} connected, but this endpoint expects a "
                      f"{ROLE_NAMES[expect_role]}")
    if num_readers is None:
        if rank != -1:
            return rank, "a broadcast reader connected to a point-to-point endpoint"
        return rank, None
    if rank == -1:
        return rank, "a point-to-point peer connected to a broadcast writer"
    if not 0 <= rank < num_readers:
        return rank, f"rank {rank} is out of range for a broadcast to {num_readers} readers"
    if rank in taken:
        return rank, f"rank {rank} is already connected"
    return rank, None


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    uid: int = struct.unpack("3i", creds)[1]
    return uid


def refusal(reply: bytes) -> str | None:
    """None for an OK reply, else the binder's reason."""
    if reply[:4] == OK_REPLY:
        return None
    if reply[:4] == ERR_REPLY:
        return reply[4:].decode(errors="replace")
    return "the binder sent an unexpected reply (not an aioengine transport endpoint?)"
