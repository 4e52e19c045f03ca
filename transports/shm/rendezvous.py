"""Handing the ring to the peer: a SOCK_SEQPACKET Unix socket in the abstract namespace.

The binding side listens on ``\\0aioengine-shm-NAME``; the connecting side connects. Frames are
one fixed little-endian struct (never pickle); the writer's ``OFFER`` carries the memfd and the
eventfds as SCM_RIGHTS. Both sides check ``SO_PEERCRED`` so the ring is only ever handed to a
process of the same user (abstract sockets have no file permissions). The connection then
stays open as the liveness channel: when the peer exits or is SIGKILLed the kernel closes its
end and our poll(2) sees POLLIN/POLLHUP at once.

    reader -> writer   HELLO  (role reader, rank)
    writer -> reader   OFFER  (capacity, num_readers, rank) + fds [memfd, reader efd, space efd]
    either             REJECT (reason text), then the connection is closed
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass

import anyio

from transports.errors import AddressError, PeerClosedError, TransportError
from transports.shm.address import socket_address, url

log = logging.getLogger(__name__)

MAGIC = b"AIOSHM01"
FRAME = struct.Struct("<8sBBHIQI")  # magic, kind, role, reserved, rank, capacity, num_readers
MAX_FRAME = 1024
HELLO, OFFER, REJECT = 1, 2, 3
READER, WRITER = 1, 2
ROLE_NAMES = {READER: "reader", WRITER: "writer"}
_RETRY_FIRST, _RETRY_MAX = 0.001, 0.05
_NOT_LISTENING = (ConnectionRefusedError, FileNotFoundError, BlockingIOError)


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    role: int
    rank: int
    capacity: int
    num_readers: int
    reason: str
    fds: list[int]

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.setblocking(False)
    return sock


def listen(name: str, backlog: int) -> socket.socket:
    sock = _socket()
    try:
        sock.bind(socket_address(name))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise AddressError(f"{url(name)} is already bound by another endpoint") from None
        raise AddressError(f"cannot bind {url(name)}: {e}") from e
    sock.listen(backlog)
    return sock


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    uid: int = struct.unpack("3i", creds)[1]
    return uid


def accept(listener: socket.socket, name: str) -> list[socket.socket]:
    """Every connection waiting on ``listener`` whose process belongs to our user."""
    conns: list[socket.socket] = []
    while True:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return conns
        sock.setblocking(False)
        uid = peer_uid(sock)
        if uid != os.getuid():
            log.warning("refused a connection to %s from uid %d", url(name), uid)
            sock.close()
            continue
        conns.append(sock)


def _try_connect(name: str) -> socket.socket | None:
    sock = _socket()
    try:
        sock.connect(socket_address(name))
    except _NOT_LISTENING:
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    uid = peer_uid(sock)
    if uid != os.getuid():
        sock.close()
        raise AddressError(f"{url(name)} is bound by a process of uid {uid}, not ours "
                           f"({os.getuid()}); refusing to share memory with it")
    return sock


def _connect_timeout(name: str, timeout: float) -> TimeoutError:
    return TimeoutError(f"nothing is bound at {url(name)}: no endpoint accepted a connection "
                        f"within {timeout} s (connect_timeout)")


def connect(name: str, timeout: float) -> socket.socket:
    """Connect to the binder, retrying until it listens or ``timeout`` passes."""
    end, delay = time.monotonic() + timeout, _RETRY_FIRST
    while (sock := _try_connect(name)) is None:
        left = end - time.monotonic()
        if left <= 0:
            raise _connect_timeout(name, timeout)
        time.sleep(min(delay, left))
        delay = min(delay * 2, _RETRY_MAX)
    return sock


async def connect_async(name: str, timeout: float) -> socket.socket:
    end, delay = time.monotonic() + timeout, _RETRY_FIRST
    while (sock := _try_connect(name)) is None:
        left = end - time.monotonic()
        if left <= 0:
            raise _connect_timeout(name, timeout)
        await anyio.sleep(min(delay, left))  # asyncio or trio
        delay = min(delay * 2, _RETRY_MAX)
    return sock


def send_frame(sock: socket.socket, kind: int, role: int, *, rank: int = 0, capacity: int = 0,
               num_readers: int = 0, reason: str = "", fds: list[int] | None = None) -> None:
    data = FRAME.pack(MAGIC, kind, role, 0, rank, capacity, num_readers)
    data += reason.encode()[:MAX_FRAME - FRAME.size]
    try:
        if fds:
            socket.send_fds(sock, [data], fds)
        else:
            sock.send(data)
    except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError) as e:
        raise PeerClosedError(f"the shm peer disconnected during set-up ({e})") from None
    except BlockingIOError:
        raise TransportError("shm rendezvous socket is full; the peer is not reading it") from None


def recv_frame(sock: socket.socket) -> Frame | None:
    """The next frame, or None if none has arrived. PeerClosedError at EOF."""
    try:
        data, fds, flags, _ = socket.recv_fds(sock, MAX_FRAME, 4, socket.MSG_CMSG_CLOEXEC)
    except BlockingIOError:
        return None
    except (ConnectionResetError, BrokenPipeError):
        data, fds, flags = b"", [], 0
    if not data:
        for fd in fds:
            os.close(fd)
        raise PeerClosedError("the shm peer closed the connection")
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) < FRAME.size \
            or data[:8] != MAGIC:
        for fd in fds:
            os.close(fd)
        raise TransportError(f"not an aioengine shm peer: got a {len(data)}-byte frame "
                             f"starting {data[:8]!r}")
    _, kind, role, _, rank, capacity, num_readers = FRAME.unpack_from(data)
    reason = data[FRAME.size:].decode(errors="replace")
    return Frame(kind, role, rank, capacity, num_readers, reason, list(fds))


def reject(sock: socket.socket, role: int, reason: str) -> None:
    """Tell a connection why it is refused and drop it."""
    with contextlib.suppress(TransportError, OSError):
        send_frame(sock, REJECT, role, reason=reason)
    sock.close()
