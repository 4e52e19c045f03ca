"""Structured messages over any transport: msgspec objects encoded as msgpack, decoded by one
typed decoder per channel. Never pickle.

A field typed ``Blob`` carries raw bytes. Small blobs travel inline (msgpack ``bin``); a blob of
at least ``oob_threshold`` bytes travels as an out-of-band buffer of the message (msgpack ext
type ``OOB_EXT`` holding its index), so a large payload is never copied into the header.
A received out-of-band ``Blob`` may be a view into transport memory that stays valid until the
next ``recv`` on the channel: ``bytes(blob)`` keeps a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import msgspec

from transports.base import AsyncReader, AsyncWriter, Buffer, Endpoint, SyncReader, SyncWriter
from transports.errors import DecodeError

T = TypeVar("T")
E = TypeVar("E", bound=Endpoint)
_Self = TypeVar("_Self", bound="_Typed[Any]")

OOB_EXT = 1  # msgpack ext code of an out-of-band buffer reference (payload: uint32 LE index)
DEFAULT_OOB_THRESHOLD = 64 * 1024
"""A ``Blob`` of at least this many bytes travels out of band instead of inside the header."""


class Blob:
    """Raw bytes in a message (a tensor's storage, a long prompt) that may travel out of band."""

    __slots__ = ("data",)

    def __init__(self, data: Buffer) -> None:
        view = memoryview(data)
        self.data = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        """The bytes, as a flat byte ``memoryview`` (no copy of ``data``)."""

    def __bytes__(self) -> bytes:
        return bytes(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Blob):
            return self.data == other.data
        if isinstance(other, (bytes, bytearray, memoryview)):
            return self.data == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Blob({len(self.data)} bytes)"


class Encoder:
    """Encodes one object into (header, out-of-band buffers). Not thread-safe: one per thread."""

    def __init__(self, *, oob_threshold: int = DEFAULT_OOB_THRESHOLD) -> None:
        if oob_threshold < 0:
            raise ValueError(f"oob_threshold must be >= 0 bytes, got {oob_threshold}")
        self._threshold = oob_threshold
        self._buffers: list[memoryview] = []
        self._enc = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, Blob):
            if len(obj.data) < self._threshold:
                return obj.data
            self._buffers.append(obj.data)
            return msgspec.msgpack.Ext(OOB_EXT, (len(self._buffers) - 1).to_bytes(4, "little"))
        raise TypeError(f"cannot encode a {type(obj).__name__} for a transport channel "
                        "(use msgspec Structs, builtin types, or Blob for raw bytes)")

    def encode(self, obj: Any) -> tuple[bytes, list[memoryview]]:
        """``(header, buffers)`` for ``send``: the msgpack header and the out-of-band blobs."""
        self._buffers = []
        try:
            header = self._enc.encode(obj)
            return header, self._buffers
        finally:
            self._buffers = []


class Decoder(Generic[T]):
    """Decodes frames into ``type_`` (a Struct, a Union of tagged Structs, any msgspec type).
    A malformed frame raises ``DecodeError`` naming the cause; the decoder stays usable."""

    def __init__(self, type_: Any) -> None:
        self.type = type_
        """The type every frame decodes into."""
        self._buffers: Sequence[memoryview] = ()
        self._dec = msgspec.msgpack.Decoder(type_, dec_hook=_dec_hook, ext_hook=self._ext_hook)

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code != OOB_EXT or len(data) != 4:
            raise ValueError(f"unknown msgpack ext type {code} ({len(data)} bytes)")
        index = int.from_bytes(data, "little")
        if index >= len(self._buffers):
            raise ValueError(f"out-of-band buffer {index} is missing: the message carries "
                             f"{len(self._buffers)}")
        return Blob(self._buffers[index])

    def decode(self, header: Buffer, buffers: Sequence[memoryview] = ()) -> T:
        """One received message (``msg.header, msg.buffers``) as a ``type_``; a frame that does
        not fit raises ``DecodeError``."""
        self._buffers = buffers
        try:
            value: T = self._dec.decode(header)
            return value
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as e:
            name = getattr(self.type, "__name__", repr(self.type))
            raise DecodeError(f"cannot decode a {len(header)}-byte frame as {name}: {e}") from e
        finally:
            self._buffers = ()


def _dec_hook(type_: type, obj: Any) -> Any:
    if type_ is Blob:
        if isinstance(obj, Blob):
            return obj
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return Blob(obj)
        raise ValueError(f"expected bytes for a Blob, got {type(obj).__name__}")
    raise TypeError(f"unsupported type {type_!r} in a channel message type")


class _Typed(Generic[E]):
    def __init__(self, endpoint: E) -> None:
        self.endpoint = endpoint

    @property
    def address(self) -> str:
        return self.endpoint.address

    def close(self) -> None:
        self.endpoint.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TypedSender(_Typed[SyncWriter]):
    """``send(obj)`` on a blocking writer."""

    def __init__(self, writer: SyncWriter, encoder: Encoder | None = None) -> None:
        super().__init__(writer)
        self.encoder = encoder or Encoder()
        """The encoder used for every message."""

    def send(self, obj: Any, timeout: float | None = None) -> None:
        """Encode ``obj`` and send it (blocking while the channel is full)."""
        header, buffers = self.encoder.encode(obj)
        self.endpoint.send(header, buffers, timeout)


class TypedReceiver(_Typed[SyncReader], Generic[T]):
    """``recv() -> T`` on a blocking reader."""

    def __init__(self, reader: SyncReader, decoder: Decoder[T]) -> None:
        super().__init__(reader)
        self.decoder = decoder
        """The channel's typed decoder."""

    def recv(self, timeout: float | None = None) -> T:
        """Receive the next message and decode it (``DecodeError`` if it does not fit)."""
        msg = self.endpoint.recv(timeout)
        return self.decoder.decode(msg.header, msg.buffers)


class AsyncTypedSender(_Typed[AsyncWriter]):
    """``await send(obj)`` on an asyncio writer."""

    def __init__(self, writer: AsyncWriter, encoder: Encoder | None = None) -> None:
        super().__init__(writer)
        self.encoder = encoder or Encoder()
        """The encoder used for every message."""

    async def send(self, obj: Any, timeout: float | None = None) -> None:
        """Encode ``obj`` and send it (awaiting while the channel is full)."""
        header, buffers = self.encoder.encode(obj)
        await self.endpoint.send(header, buffers, timeout)


class AsyncTypedReceiver(_Typed[AsyncReader], Generic[T]):
    """``await recv() -> T`` on an asyncio reader."""

    def __init__(self, reader: AsyncReader, decoder: Decoder[T]) -> None:
        super().__init__(reader)
        self.decoder = decoder
        """The channel's typed decoder."""

    async def recv(self, timeout: float | None = None) -> T:
        """Receive the next message and decode it (``DecodeError`` if it does not fit)."""
        msg = await self.endpoint.recv(timeout)
        return self.decoder.decode(msg.header, msg.buffers)
