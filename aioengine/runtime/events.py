"""Lifecycle events a child sends its parent over a one-way ``multiprocessing.Pipe``.

Frames are msgpack maps written with ``Connection.send_bytes`` (never ``Connection.send``, which
pickles), so any msgpack decoder reads them. Order: STARTUP, then READY (with its payload) or
ERROR (exception type, message, the child's formatted traceback), then SHUTDOWN (cleanup is
starting) and DEAD (cleanup finished; ``exit_code`` is what the process is about to exit with).
"""

from __future__ import annotations

import enum
import logging
import os
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import msgspec

logger = logging.getLogger(__name__)


class EventType(str, enum.Enum):
    STARTUP = "STARTUP"
    READY = "READY"
    ERROR = "ERROR"
    SHUTDOWN = "SHUTDOWN"
    DEAD = "DEAD"


class Event(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: EventType
    name: str
    """The child's name, e.g. ``aioengine-worker-tp0``."""
    pid: int
    time: float
    """``time.time()`` in the child when the event was sent."""
    payload: dict[str, Any] = {}
    """READY only: what ``BusyLoopTarget.init`` returned (addresses, capacities, ...)."""
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    exit_code: int | None = None


class EventDecodeError(ValueError):
    """A frame on an event pipe is not a valid ``Event``."""


def encode_event(event: Event) -> bytes:
    return msgspec.msgpack.encode(event)


def decode_event(frame: bytes, decoder: msgspec.msgpack.Decoder[Event] | None = None) -> Event:
    try:
        return (decoder or msgspec.msgpack.Decoder(Event)).decode(frame)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise EventDecodeError(f"malformed lifecycle event frame ({len(frame)} bytes): {exc}") \
            from exc


class EventSender:
    """The child's end: builds and sends events. Sending never raises once the parent is gone
    (a dead parent is the parent watch's business), so cleanup always runs."""

    def __init__(self, conn: Connection, name: str) -> None:
        self._conn = conn
        self._name = name
        self._encoder = msgspec.msgpack.Encoder()
        self._parent_gone = False

    def send(self, type: EventType, *, payload: dict[str, Any] | None = None,
             exit_code: int | None = None) -> None:
        self._send(Event(type=type, name=self._name, pid=os.getpid(), time=time.time(),
                         payload=payload or {}, exit_code=exit_code))

    def send_ready(self, payload: Any) -> None:
        """READY with the target's payload; a payload that is not a msgpack-encodable dict raises
        ``TypeError`` naming the problem (the busy loop turns that into ERROR)."""
        if not isinstance(payload, dict):
            raise TypeError("BusyLoopTarget.init must return a dict (the READY payload), got "
                            f"{type(payload).__name__}")
        bad = [k for k in payload if not isinstance(k, str)]
        if bad:
            raise TypeError(f"READY payload keys must be str, got {bad[0]!r}")
        event = Event(type=EventType.READY, name=self._name, pid=os.getpid(), time=time.time(),
                      payload=payload)
        try:
            frame = self._encoder.encode(event)
        except (TypeError, msgspec.EncodeError) as exc:
            raise TypeError(f"READY payload is not msgpack-encodable: {exc}") from exc
        self._write(frame)

    def send_error(self, exc: BaseException) -> None:
        exc_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
        if type(exc).__module__ == "builtins":
            exc_type = type(exc).__qualname__
        self._send(Event(type=EventType.ERROR, name=self._name, pid=os.getpid(), time=time.time(),
                         exc_type=exc_type, message=str(exc),
                         traceback="".join(traceback.format_exception(exc))))

    def _send(self, event: Event) -> None:
        self._write(self._encoder.encode(event))

    def _write(self, frame: bytes) -> None:
        if self._parent_gone:
            return
        try:
            self._conn.send_bytes(frame)
        except OSError as exc:  # EPIPE / closed: the parent is gone or stopped listening
            self._parent_gone = True
            logger.debug("%s: event pipe closed (%s); further events dropped", self._name, exc)

    def close(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass
