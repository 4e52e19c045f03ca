"""The missing ``if __name__ == "__main__":`` guard, caught with one clear message.

Children are started with ``spawn``, which rebuilds ``__main__`` in every child by running the
parent's main script again (as ``__mp_main__``). A script that starts an engine at its top
level, unguarded, would start one again inside each child; multiprocessing then refuses with a
long traceback about the "bootstrapping phase", and the parent only learns that its child died.

``check_main_is_guarded()`` runs where an engine is about to be started. In such a child it
logs one line and leaves with ``UnguardedMainError``: on the main thread a ``SystemExit`` with
``UNGUARDED_MAIN_EXIT`` as its status (Python prints nothing more), which the parent's
supervisor turns into an ``EngineStartupError`` that says to add the guard.

In the parent it checks the other way ``spawn`` fails: a main script that no child can run
again. ``python - < job.py`` (or ``python < job.py``) names its main module's file
``'<stdin>'``; each child would look for a file of that name and die before READY. The
parent raises ``EngineStartupError`` at once instead, before anything is bound or spawned.
(``python -c``, the REPL and ``python -i`` leave ``__file__`` unset: children skip the main
module then, and those work. Changing ``__main__`` for the duration of a spawn would make them
work too, but it is the user's module, read by other threads meanwhile: we do not touch it.)
"""

from __future__ import annotations

import logging
import multiprocessing.process
import os
import sys
import threading
from types import FrameType

from aioengine.runtime.errors import EngineStartupError

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


def main_script_children_cannot_run() -> str | None:
    """``__main__.__file__`` when ``spawn`` would make every child run that file and there is
    none ('<stdin>', or a script deleted since it started), else None. Mirrors
    ``multiprocessing.spawn.get_preparation_data``: a main module with a spec is imported by
    name, one without ``__file__`` is skipped, a relative path is taken from the start-up
    directory."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None
    if path.startswith("<") and path.endswith(">"):  # '<stdin>': no file at all
        return path
    start_dir = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or os.getcwd()
    return None if os.path.exists(os.path.join(start_dir, path)) else path


def unrunnable_main_message(path: str) -> str:
    """What the parent says instead of spawning children that would die on ``path``."""
    if path == "<stdin>":
        what = ("the main script was read from standard input ('<stdin>', e.g. "
                "`python - < script.py`), and every child process must run it again")
        fix = (f"save it to a file and run `python file.py` (engine started under {GUARD}), "
               "or pass it with `python -c`")
    else:
        what = (f"the main script {path!r} is not a file any more, and every child process "
                "must run it again")
        fix = "run the program from a file that exists while it runs"
    return (f"cannot start the engine's processes: {what} (processes are started with "
            f"'spawn'): {fix}")


def check_main_is_guarded() -> None:
    """Raise ``UnguardedMainError`` (or ``UnguardedMainThreadError`` off the main thread) in a
    spawned child that is re-running an unguarded main script, and ``EngineStartupError`` in a
    process whose main script no child could run (see the module docstring); otherwise do
    nothing. Cheap: it runs before every engine start and every spawn."""
    script = script_importing_in_spawned_child()
    if script is None:
        unrunnable = main_script_children_cannot_run()
        if unrunnable is not None:
            raise EngineStartupError(unrunnable_main_message(unrunnable))
        return
    message = (f"{script!r} started an engine while a child process imported it; put the "
               f"code that starts the engine under {GUARD}")
    if threading.current_thread() is threading.main_thread():
        logger.critical("%s", message)  # one line, then a silent exit with the status
        raise UnguardedMainError(UNGUARDED_MAIN_EXIT)
    raise UnguardedMainThreadError(message)
