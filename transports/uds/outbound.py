"""Sans-IO progress of one frame going out on one connection (partial sendmsg writes)."""

from __future__ import annotations

import socket

# Never raise SIGPIPE in a host that did not ignore it: a dead peer is an EPIPE error instead.
SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


class Outbound:
    __slots__ = ("parts", "started")

    def __init__(self, parts: list[memoryview]) -> None:
        self.parts = list(parts)
        self.started = False

    def send_some(self, sock: socket.socket) -> bool:
        """Write what the socket takes now; True when the whole frame is out. Raises
        BlockingIOError when nothing could be written."""
        n = sock.sendmsg(self.parts, (), SEND_FLAGS)
        if n:
            self.started = True
        parts = self.parts
        while parts and n >= len(parts[0]):
            n -= len(parts[0])
            parts.pop(0)
        if n:
            parts[0] = parts[0][n:]
        return not parts

    def detach(self) -> None:
        """Copy the unsent rest so the caller's buffers are free once ``send`` returns."""
        self.parts = [memoryview(b"".join(self.parts))]
