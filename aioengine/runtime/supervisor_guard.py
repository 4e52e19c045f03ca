"""The missing ``if __name__ == "__main__":`` guard, caught with one clear message.

Children are started with ``spawn``, which rebuilds ``__main__`` in every child by running the
parent's main script again (as ``__mp_main__``). A script that starts an engine at its top
level, unguarded, would start one again inside each child; multiprocessing then refuses with a
long traceback about the "bootstrapping phase", and the parent only learns that its child died.

``check_main_is_guarded()`` runs where an engine is about to be started. In such a child it
logs one line and leaves with ``UnguardedMainError``: on the main thread a ``SystemExit`` with
``UNGUARDED_MAIN_EXIT`` as its status (Python prints nothing more), which the parent's
supervisor turns into an ``EngineStartupError`` that says to add the guard.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import FrameType

logger = logging.getLogger(__name__)

UNGUARDED_MAIN_EXIT = 78  # EX_CONFIG in sysexits.h: a configuration error
"""The exit status of a child that found its parent's main script starting an engine."""

GUARD = 'if __name__ == "__main__":'


def main_script() -> str:
    """The main script's path (or module name), for messages."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(main, "__file__", None) or getattr(spec, "name", None) or "the main script"


def unguarded_main_message() -> str:
    """What the parent says when a child exited with ``UNGUARDED_MAIN_EXIT``."""
    return (f"the main script {main_script()!r} starts an engine when it is imported, and every "
            "child process imports it again (processes are started with 'spawn'): put the "
            f"code that starts the engine (LLM, AsyncMPClient, asyncio.run(...)) under {GUARD}")


class UnguardedMainError(SystemExit):
    """Raised in a spawned child that is re-running the parent's unguarded main script."""


class UnguardedMainThreadError(RuntimeError):
    """The same, off the main thread, where a ``SystemExit`` would end only that thread."""


def script_importing_in_spawned_child() -> str | None:
    """The parent's main script (path or module name) while a spawned child runs it to rebuild
    ``__main__``, else None: that script's top-level code, named ``__mp_main__``, is on the
    main thread's stack. Once the child runs its target the script's top level is on no stack.
    (The name is the test: ``multiprocessing.parent_process()`` is set only after this.)"""
    main_id = threading.main_thread().ident
    frame: FrameType | None = (sys._getframe() if threading.get_ident() == main_id
                               else sys._current_frames().get(main_id or -1))
    while frame is not None:
        globs = frame.f_globals
        if frame.f_code.co_name == "<module>" and globs.get("__name__") == "__mp_main__":
            spec = globs.get("__spec__")
            return globs.get("__file__") or getattr(spec, "name", None) or "the main script"
        frame = frame.f_back
    return None


def check_main_is_guarded() -> None:
    """Raise ``UnguardedMainError`` (or ``UnguardedMainThreadError`` off the main thread) in a
    spawned child that is re-running an unguarded main script; otherwise do nothing."""
    script = script_importing_in_spawned_child()
    if script is None:
        return
    message = (f"{script!r} started an engine while a child process imported it; put the "
               f"code that starts the engine under {GUARD}")
    if threading.current_thread() is threading.main_thread():
        logger.critical("%s", message)  # one line, then a silent exit with the status
        raise UnguardedMainError(UNGUARDED_MAIN_EXIT)
    raise UnguardedMainThreadError(message)
