"""The engine's death as the client sees it: once declared, every open stream is woken to raise
``EngineDeadError`` and every pending utility call fails with it, and so does every later call.

Death is declared from three places: the supervisor's monitor thread (a child process died;
hopped onto the client's loop by its ``Backend``), the output task (the output channel closed
under it), and an ``EngineFailure`` message or an undecodable frame (``EngineMessageRouter``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from aioengine.client.backend_types import Backend, CallFuture, Waker
from aioengine.client.request_stream import RequestStream
from aioengine.runtime.errors import EngineDeadError

logger = logging.getLogger(__name__)


class EngineDeath:
    """Holds no reference to the client, so the monitor thread's callback does not keep a
    dropped client alive."""

    __slots__ = ("_calls", "_streams", "backend", "declared", "error", "quiet", "watching")

    def __init__(self, streams: Mapping[str, RequestStream],
                 calls: Mapping[int, CallFuture]) -> None:
        self._streams = streams
        self._calls = calls
        self.error: EngineDeadError | None = None
        self.declared: Waker = asyncio.Event()
        """Set (on the client's loop) when the engine is declared dead."""
        self.backend: Backend | None = None
        """The client's loop, where a death seen by the monitor thread is declared."""
        self.watching = False
        """True once the output task runs; before that, ``start()`` reports failures itself."""
        self.quiet = False
        """True once the client is shut down: its own 'death' is not logged as an error."""

    def declare(self, error: EngineDeadError) -> None:
        """The engine is dead (the first cause wins): wake every stream, fail every call."""
        if self.error is not None:
            return
        self.error = error
        self.declared.set()
        if not self.quiet:
            logger.error("engine is dead: %s", error)
        for stream in self._streams.values():
            stream.event.set()
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(error)

    def fresh_error(self) -> EngineDeadError:
        """A fresh exception per raiser, so concurrent tracebacks do not pile onto one."""
        dead = self.error
        assert dead is not None
        err = EngineDeadError(str(dead), process=dead.process, exitcode=dead.exitcode)
        err.__cause__ = dead
        return err

    def bind(self, backend: Backend) -> None:
        """The client starts on ``backend``'s loop: deaths are declared there from now on."""
        self.backend = backend
        if self.error is None:
            self.declared = backend.event()

    def from_monitor_thread(self, error: EngineDeadError) -> None:
        """The supervisor's monitor thread saw a child die."""
        backend = self.backend
        if backend is not None:
            backend.call_soon_threadsafe(self._on_child_death, error)

    def _on_child_death(self, error: EngineDeadError) -> None:
        if self.watching:
            self.declare(error)
