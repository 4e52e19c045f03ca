"""Accepting the peers of a binding uds endpoint: credential check, hello, reply."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field

from transports.uds import address as A
from transports.uds.framing import FrameReader, frame_parts

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 5.0  # a connector sends its hello right after connect(); this is generous


@dataclass(eq=False)
class Peer:
    sock: socket.socket
    rank: int = -1
    reader: FrameReader = field(default_factory=FrameReader)
    eof: bool = False

    def fileno(self) -> int:
        return self.sock.fileno()


def frame_bytes(header: bytes) -> bytes:
    return b"".join(frame_parts(memoryview(header), []))


@dataclass
class AcceptSpec:
    """What a binder waits for: ``count`` connectors of role ``role`` (broadcast: ranks)."""

    url: str
    role: int
    count: int
    num_readers: int | None  # set for a broadcast writer
    sndbuf: int | None = None  # a writer's capacity, applied to each accepted connection
    taken: set[int] = field(default_factory=set)

    def admit(self, sock: socket.socket, hello_header: bytes) -> int | None:
        """Check credentials and the hello; reply; return the rank, or None if refused."""
        if A.peer_uid(sock) != os.getuid():
            reason: str | None = "peer runs as another user"
            rank = None
        else:
            rank, reason = A.check_hello(hello_header, self.role, self.num_readers, self.taken)
        if reason is not None:
            log.warning("refused a connection on %s: %s", self.url, reason)
            _send_small(sock, frame_bytes(A.ERR_REPLY + reason.encode()))
            sock.close()
            return None
        assert rank is not None
        self.taken.add(rank)
        _send_small(sock, frame_bytes(A.OK_REPLY))
        return rank


def _send_small(sock: socket.socket, data: bytes) -> None:
    # A fresh connection's send buffer is empty, so a few bytes never block.
    try:
        sock.sendall(data, socket.MSG_NOSIGNAL)
    except OSError as e:
        log.debug("peer went away during the handshake: %s", e)
