"""The transport contract: every implementation provides these endpoint classes.

A message is a header (bytes-like) plus zero or more out-of-band buffers. Implementations must
not copy a buffer more than the wire needs. Endpoints come as blocking (``Sync*``) and asyncio
(``Async*``) forms; any sync side talks to any async side of the same transport, across
processes.

Roles: the *binding* side creates the address (socket file, segment, port) and owns its cleanup;
the *connecting* side attaches to ``address``. By default the writer binds. Broadcast has one
writer and ``num_readers`` readers; each reader connects with its ``rank`` (0..N-1) and the
writer's first ``send`` waits until every reader has connected, so no early message is lost.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

Buffer = bytes | bytearray | memoryview
"""What ``send`` accepts for a header or buffer (anything exposing a contiguous buffer)."""


@dataclass(slots=True)
class Message:
    """One received message. ``header`` and ``buffers`` may be views into transport memory that
    stay valid until the next ``recv`` on the same endpoint; copy them to keep them longer."""

    header: memoryview
    """The message's header bytes (for typed channels: the msgpack frame)."""
    buffers: list[memoryview] = field(default_factory=list)
    """The out-of-band buffers sent with it, in order (empty for most messages)."""


_E = TypeVar("_E", bound="Endpoint")


class Endpoint(abc.ABC):
    """Common to every endpoint: an address to report, and an idempotent close."""

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """The full URL a peer passes to connect (with the bound port for ``zmq+tcp://...:0``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything (fds, mappings, files). Idempotent. Wakes any waiter on this
        endpoint with ``ChannelClosedError``. The binding side removes its socket file or
        segment here."""

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncWriter(Endpoint):
    """The blocking sending end of a channel (point-to-point or broadcast), for busy loops and
    threads. One thread at a time; ``close()`` may come from any thread."""

    @abc.abstractmethod
    def send(
        self, header: Buffer, buffers: Sequence[Buffer] = (), timeout: float | None = None
    ) -> None:
        """Send one message. Blocks while the channel is full (bounded backpressure); raises
        ``TimeoutError`` after ``timeout`` seconds, ``PeerClosedError`` if the peer is gone."""


class SyncReader(Endpoint):
    """The blocking receiving end of a channel. One thread at a time; ``close()`` may come from
    any thread and wakes a blocked ``recv`` with ``ChannelClosedError``."""

    @abc.abstractmethod
    def recv(self, timeout: float | None = None) -> Message:
        """Receive the next message in order. Raises ``TimeoutError`` after ``timeout`` seconds,
        ``PeerClosedError`` within 1 s of the writer's death, ``ChannelClosedError`` on close."""


class AsyncWriter(Endpoint):
    """The asyncio sending end of a channel; use it from one event loop."""

    @abc.abstractmethod
    async def send(
        self, header: Buffer, buffers: Sequence[Buffer] = (), timeout: float | None = None
    ) -> None:
        """As ``SyncWriter.send`` but awaits instead of blocking the event loop."""


class AsyncReader(Endpoint):
    """The asyncio receiving end of a channel; use it from one event loop."""

    @abc.abstractmethod
    async def recv(self, timeout: float | None = None) -> Message:
        """As ``SyncReader.recv`` but awaits. Cancelling it loses no message: the next ``recv``
        gets the one that was pending."""
