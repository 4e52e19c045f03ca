"""Ctrl-C while one of aioengine's own programs (``python -m aioengine.serve``, ``python -m
aioengine.bench``) is still starting: one line on stderr and exit status 130, not Python's
``KeyboardInterrupt`` traceback from whichever import was running.

For programs only: the library never installs signal handlers in the host process. Standard
library only, so a program installs it before its slow imports (aiohttp, torch). It is meant
for the stretches where the program has no child process and nothing to clean up (imports,
argument parsing, the interpreter's teardown); around an engine the program handles SIGINT
itself (``asyncio`` signal handlers, or ``KeyboardInterrupt`` unwinding ``with`` blocks).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

INTERRUPTED_EXIT = 128 + signal.SIGINT
"""130: what a shell reports for a program stopped by Ctrl-C."""


def interrupted_line(prog: str) -> str:
    return f"{prog}: interrupted (SIGINT)"


def exit_at_once_on_sigint(prog: str) -> None:
    """Make SIGINT write ``interrupted_line(prog)`` to stderr and ``_exit`` with 130 at once.

    ``os.write`` and ``os._exit`` take no lock the interrupted code may hold (a ``print`` or a
    logging handler could), and nothing is unwound: an import cut in half has no ``finally``
    worth running. Call on the main thread."""
    line = (interrupted_line(prog) + "\n").encode()

    def on_sigint(_signum: int, _frame: FrameType | None) -> None:
        os.write(2, line)
        os._exit(INTERRUPTED_EXIT)

    on_sigint.exits_at_once = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, on_sigint)


def unwind_on_sigint(prog: str, deadline: int) -> None:
    """Where ``exit_at_once_on_sigint`` is installed (the program runs as itself, on the main
    thread), switch to unwinding: a SIGINT raises ``KeyboardInterrupt`` once, so ``with``
    blocks shut their engines down; the line and ``_exit(130)`` follow a second SIGINT, or the
    unwinding still running ``deadline`` seconds later (a safety net: ``KeyboardInterrupt`` can
    land where clean-up cannot finish, as it did inside anyio's ``start_blocking_portal``
    before the blocking clients got ``PortalThread``). A caller's own SIGINT handler
    (``main()`` called from other code) is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if not getattr(signal.getsignal(signal.SIGINT), "exits_at_once", False):
        return

    def on_sigint(_signum: int, _frame: FrameType | None) -> None:
        exit_at_once_on_sigint(prog)
        signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGINT))
        signal.alarm(deadline)  # no thread: a handler may run while a threading lock is held
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def unwound() -> None:
    """The program has unwound after its ``KeyboardInterrupt``: cancel ``unwind_on_sigint``'s
    deadline (only that alarm; a second SIGINT still exits at once)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if getattr(signal.getsignal(signal.SIGALRM), "exits_at_once", False):
        signal.alarm(0)
