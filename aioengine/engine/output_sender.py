"""How the engine process sends its ``EngineMessage`` frames to the client.

Straight from the engine loop while the channel has room: a non-blocking ``send`` of a few
hundred bytes costs less than waking an output thread, which then competes with the loop for
the GIL in the middle of the next step's forward (measured: ~10% of the loop's wall time on a
loaded 2-core box went to that hand-off). When the channel is full (a slow client) the frame,
and every later one until the backlog has drained, goes to a background thread that blocks on
the channel instead, so the loop never waits for the client and frames stay in order.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import msgspec

from aioengine.messages.engine_io import EngineMessage
from transports import ChannelClosedError, PeerClosedError, SyncWriter

logger = logging.getLogger(__name__)

CLOSED_BY_CLIENT = "the client closed the output channel"


class OutputSender:
    """``send`` from one thread (the engine loop); ``close`` flushes the backlog (bounded).

    ``on_failure(reason)`` is called once, from whichever thread saw the channel fail; frames
    after a failure are dropped."""

    def __init__(self, writer: SyncWriter, on_failure: Callable[[str], None],
                 name: str = "engine-output") -> None:
        self._writer = writer
        self._on_failure = on_failure
        self._encoder = msgspec.msgpack.Encoder()
        self._backlog: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        # Single-writer counters (no lock): the loop sends inline only when the thread has
        # finished every frame handed to it, so the two never use the writer at once.
        self._queued = 0  # written by the loop
        self._flushed = 0  # written by the thread
        self._failed = False
        self._fail_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name=name, daemon=True)
        self._thread.start()

    @property
    def backlog(self) -> int:
        """Frames waiting for the background thread (0 while the client keeps up)."""
        return self._queued - self._flushed

    def send(self, msg: EngineMessage) -> None:
        if self._failed or self._closed:
            return
        frame = self._encoder.encode(msg)
        if self._queued == self._flushed:
            try:
                self._writer.send(frame, timeout=0)
                return
            except TimeoutError:
                pass  # full: nothing was sent (the transport contract); the thread waits
            except Exception as exc:
                self._fail(exc)
                return
        self._queued += 1
        self._backlog.put(frame)

    def close(self, timeout: float = 5.0) -> None:
        """Let the thread flush what is queued (up to ``timeout``), then stop it. Idempotent."""
        if not self._closed:
            self._closed = True
            self._backlog.put(None)
        self._thread.join(timeout)

    def _drain(self) -> None:
        while True:
            frame = self._backlog.get()
            if frame is None:
                return
            if not self._failed:
                try:
                    self._writer.send(frame)
                except Exception as exc:
                    self._fail(exc)
            self._flushed += 1

    def _fail(self, exc: Exception) -> None:
        with self._fail_lock:
            if self._failed:
                return
            self._failed = True
        if isinstance(exc, PeerClosedError | ChannelClosedError):
            self._on_failure(CLOSED_BY_CLIENT)
        else:
            logger.error("output channel failed: %s: %s", type(exc).__name__, exc)
            self._on_failure(f"output channel failed: {type(exc).__name__}: {exc}")
