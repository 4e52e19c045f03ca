"""Errors about child processes, raised in the parent (the public API re-exports both)."""

from __future__ import annotations

import signal


def describe_exitcode(exitcode: int | None) -> str:
    """``exit code 3`` / ``killed by signal SIGKILL (-9)`` / ``still running``, for messages."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            signame = signal.Signals(-exitcode).name
        except ValueError:
            signame = f"signal {-exitcode}"
        return f"killed by signal {signame} ({exitcode})"
    return f"exit code {exitcode}"


class EngineStartupError(RuntimeError):
    """A child process failed before it reported READY (it raised, died, or timed out).

    ``child_traceback`` is the child's own formatted traceback when it raised; the message
    includes it so the child's file and line show up wherever the error is printed.
    """

    def __init__(self, message: str, *, process: str | None = None,
                 exitcode: int | None = None, exc_type: str | None = None,
                 child_message: str | None = None, child_traceback: str | None = None) -> None:
        full = message
        if child_traceback:
            full = f"{message}\n\nTraceback in child process {process!r}:\n{child_traceback}"
        super().__init__(full.rstrip("\n"))
        self.process = process
        """The failing child's name, e.g. ``aioengine-engine``; None if no child was started."""
        self.exitcode = exitcode
        """Its exit code once it exited (negative: killed by that signal), else None."""
        self.exc_type = exc_type
        """The qualified name of the exception the child raised, if it raised."""
        self.child_message = child_message
        """That exception's message."""
        self.child_traceback = child_traceback
        """The child's formatted traceback."""


class EngineDeadError(RuntimeError):
    """A process of a running engine died; every open stream fails with this."""

    def __init__(self, message: str = "the engine process died", *, process: str | None = None,
                 exitcode: int | None = None) -> None:
        super().__init__(message)
        self.process = process
        """The name of the process that died, when one did (e.g. ``aioengine-engine``)."""
        self.exitcode = exitcode
        """Its exit code (negative: killed by that signal), when known."""


class EngineOverloadedError(RuntimeError):
    """A request refused at once because the engine's queue is at its limit
    (``EngineConfig.max_queued_requests`` / ``max_queued_tokens``); retry later."""

    def __init__(self, message: str, *, queued_requests: int, queued_tokens: int) -> None:
        super().__init__(message)
        self.queued_requests = queued_requests
        """Requests waiting for their first step when this one was refused."""
        self.queued_tokens = queued_tokens
        """Their prompt tokens."""
