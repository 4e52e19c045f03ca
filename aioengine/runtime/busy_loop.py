"""The template every child process runs (engine, worker, tokenizer, detokenizer).

``child_main`` is the spawn entry point; ``run_busy_loop`` does the work: report STARTUP,
install a SIGTERM handler that requests shutdown (and unwinds the start-up itself while the
target is built and initialised; SIGINT is ignored: the parent decides),
watch the parent, build the target, ``init`` it, report READY, call ``step`` until shutdown is
requested, and on every exit path report SHUTDOWN, run ``cleanup`` and report DEAD. An exception
reports ERROR first.
"""

from __future__ import annotations

import abc
import importlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from aioengine.runtime.events import EventSender, EventType
from aioengine.runtime.parent_watch import start_parent_watch
from aioengine.runtime.procctl import set_process_title
from aioengine.runtime.shutdown import ShutdownSignal

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopContext:
    """What a target sees of its process: its name, its parent, and the shutdown flag."""

    name: str
    parent_pid: int
    shutdown: ShutdownSignal

    @property
    def shutdown_requested(self) -> bool:
        return self.shutdown.requested

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until shutdown is requested (True) or ``timeout`` passes (False)."""
        return self.shutdown.wait(timeout)

    def add_wakeup(self, callback: Callable[[], None]) -> None:
        """See ``ShutdownSignal.add_wakeup``: wake a blocking wait when shutdown is requested."""
        self.shutdown.add_wakeup(callback)

    def request_shutdown(self, reason: str) -> None:
        """The target itself wants the loop to end (e.g. its peer closed the channel)."""
        self.shutdown.request(reason)


class BusyLoopTarget(abc.ABC):
    """What a child process runs. Built in the child by a factory ``f(args: bytes) -> target``."""

    @abc.abstractmethod
    def init(self, ctx: LoopContext) -> dict[str, Any]:
        """Set up (open endpoints, load the model, ...); return the READY payload: a dict of
        msgpack-encodable values with str keys (addresses, capacities)."""

    @abc.abstractmethod
    def step(self, ctx: LoopContext) -> None:
        """One unit of work, called repeatedly. It may block waiting for work, but must return
        soon after ``ctx.shutdown_requested`` turns true: wait in short slices
        (``recv(timeout=0.1)``), or register ``ctx.add_wakeup`` to break the wait."""

    @abc.abstractmethod
    def cleanup(self) -> None:
        """Release everything ``init`` created. Runs on every exit path -- also after ``init``
        raised halfway -- so it must cope with partial set-up."""


TargetFactory = Callable[[bytes], BusyLoopTarget]
TargetRef = str | TargetFactory


def resolve_target(ref: TargetRef) -> TargetFactory:
    """``"package.module:qualname"`` -> the callable; a callable is returned as is."""
    if callable(ref):
        return ref
    module_name, qualname = split_target_ref(ref)
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"target {ref!r}: module {module_name!r} has no attribute "
                                 f"{qualname!r}") from None
    if not callable(obj):
        raise TypeError(f"target {ref!r} is a {type(obj).__name__}, not a callable factory")
    factory: Callable[[bytes], BusyLoopTarget] = obj
    return factory


def split_target_ref(ref: str) -> tuple[str, str]:
    """Validate the ``"module:qualname"`` form (cheap: imports nothing)."""
    if not isinstance(ref, str):
        raise TypeError(f"target must be a 'module:qualname' string or a callable, got "
                        f"{type(ref).__name__}")
    module_name, sep, qualname = ref.partition(":")
    if not sep or not module_name or not qualname or ":" in qualname:
        raise ValueError(f"target must look like 'package.module:factory', got {ref!r}")
    return module_name, qualname


def child_main(target: TargetRef, args: bytes, events: Connection, parent_pid: int,
               name: str) -> None:
    """Spawn entry point; exits the process with ``run_busy_loop``'s exit code."""
    code = run_busy_loop(target, args, events, parent_pid, name)
    if code:
        raise SystemExit(code)


def run_busy_loop(target: TargetRef, args: bytes, events: Connection, parent_pid: int,
                  name: str) -> int:
    """Run one child's whole life; returns the exit code (0 clean, 1 after an error)."""
    if multiprocessing.parent_process() is None:
        raise RuntimeError("run_busy_loop runs only in a child process started by "
                           "aioengine.runtime.Supervisor (it installs signal handlers)")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run_busy_loop must run in the child's main thread")
    set_process_title(name)
    shutdown = ShutdownSignal()
    # While the target is built and initialised (imports, model load: seconds, more on a cold
    # or busy machine) a SIGTERM unwinds that work at once, as Ctrl-C would; later it only
    # requests the stop, which the loop honours between steps.
    starting = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal starting
        shutdown.request(f"received {signal.Signals(signum).name}")
        if starting:
            starting = False  # once: the unwinding and its cleanup run to the end
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    # SIGINT is a terminal's Ctrl-C, sent to the whole process group: our parent got it too,
    # and it decides (a server drains its requests first, then stops us; a notebook's
    # interrupt keeps the engine). We stop when it says so, or when it dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Supervisor.spawn started us with SIGINT blocked (see there): one that came while we
    # bootstrapped is dropped now, as ignored.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    done = threading.Event()
    start_parent_watch(parent_pid, shutdown, done)
    sender = EventSender(events, name)
    # From STARTUP on, SIGTERM means a clean stop (before it, the default action: nothing to
    # clean up yet).
    sender.send(EventType.STARTUP)
    ctx = LoopContext(name=name, parent_pid=parent_pid, shutdown=shutdown)
    instance: BusyLoopTarget | None = None
    code = 0
    try:
        starting = True
        try:
            if shutdown.requested:  # a SIGTERM came before we were ready to unwind
                raise SystemExit(0)
            made = resolve_target(target)(args)
            if not isinstance(made, BusyLoopTarget):
                raise TypeError(f"target factory {target!r} returned {type(made).__name__}, "
                                "not a BusyLoopTarget")
            instance = made
            payload = instance.init(ctx)
        finally:
            starting = False
        sender.send_ready(payload)
        logger.debug("%s (pid %d) ready", name, os.getpid())
        while not shutdown.requested:
            instance.step(ctx)
        logger.debug("%s: leaving the loop: %s", name, shutdown.reason)
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            logger.debug("%s: stopped: %s", name, shutdown.reason or "SystemExit")
            code = 0
        else:
            logger.error("%s failed: %s: %s", name, type(exc).__name__, exc)
            sender.send_error(exc)
            code = 1
    finally:
        sender.send(EventType.SHUTDOWN)
        if instance is not None:
            try:
                instance.cleanup()
            except Exception as exc:
                logger.exception("%s: cleanup failed", name)
                sender.send_error(exc)
                code = 1
        sender.send(EventType.DEAD, exit_code=code)
        sender.close()
        done.set()
    return code
