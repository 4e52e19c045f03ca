"""Supervisor: the parent's side of a set of child processes running ``run_busy_loop``.

Thread-based so it works the same in a plain program, inside a child (the engine supervises its
workers) and under an asyncio host. The death callback runs on the monitor thread; asyncio users
hop to their loop with ``loop.call_soon_threadsafe``. It never installs signal handlers.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from typing import Any

from aioengine.runtime.busy_loop import TargetRef, child_main, split_target_ref
from aioengine.runtime.errors import EngineDeadError, describe_exitcode
from aioengine.runtime.events import Event
from aioengine.runtime.spawn_exec import ExplicitEnvProcess
from aioengine.runtime.supervisor_guard import check_main_is_guarded
from aioengine.runtime.supervisor_state import SupervisorState

logger = logging.getLogger(__name__)

DeathCallback = Callable[[str, "int | None"], None]
"""``on_death(name, exitcode)``; exitcode < 0 means killed by that signal (multiprocessing's
convention). Called from the monitor thread within 1 s of a death the supervisor did not cause
by ``shutdown()``."""


@dataclass(frozen=True)
class ChildSpec:
    """One child process: its name (also its process title), the target factory that builds its
    ``BusyLoopTarget`` in the child, and the bytes handed to that factory (msgpack, typically)."""

    name: str
    target: TargetRef
    args: bytes = b""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables set in the child's environment from its first instruction: for what is read
    before the interpreter runs (``GLIBC_TUNABLES``); the parent's own environment is kept."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not self.name.isprintable():
            raise ValueError(f"child name must be a non-empty printable str, got {self.name!r}")
        if isinstance(self.target, str):
            split_target_ref(self.target)
        elif callable(self.target):
            qualname = getattr(self.target, "__qualname__", "")
            if "<" in qualname or not getattr(self.target, "__module__", None):
                raise ValueError(f"target of child {self.name!r} must be a module-level callable "
                                 f"(spawn imports it by name), got {self.target!r}")
        else:
            raise TypeError(f"target of child {self.name!r} must be a 'module:qualname' str or "
                            f"a callable, got {type(self.target).__name__}")
        if not all(isinstance(k, str) and k and "=" not in k and isinstance(v, str)
                   for k, v in self.env.items()):
            raise ValueError(f"env of child {self.name!r} must map names to str values, got "
                             f"{dict(self.env)!r}")
        if not isinstance(self.args, (bytes, bytearray)):
            raise TypeError(f"args of child {self.name!r} must be bytes (encode structured data "
                            f"as msgpack), got {type(self.args).__name__}")


HOST_GRACE = 5.0
NESTED_GRACE = 3.0


def default_grace() -> float:
    """5 s in the host; 3 s inside a child process (the engine supervising its workers), so a
    child still stopping its own children gracefully is not SIGKILLed by its parent first."""
    return HOST_GRACE if multiprocessing.parent_process() is None else NESTED_GRACE


class Supervisor:
    """Start named children, wait for their READY, watch them, and stop them.

    ``shutdown()`` is idempotent: SIGTERM, up to ``shutdown_grace`` seconds (default: see
    ``default_grace``) for every child (and its descendants) to exit, then SIGKILL of whatever
    is left of the process tree. It also runs when the supervisor is garbage-collected unclosed,
    and at interpreter exit; ``on_death`` may refer back to the owner without keeping it alive
    (the monitor thread holds it weakly).
    """

    def __init__(self, on_death: DeathCallback | None = None, *,
                 shutdown_grace: float | None = None) -> None:
        if shutdown_grace is None:
            shutdown_grace = default_grace()
        if shutdown_grace < 0:
            raise ValueError(f"shutdown_grace must be >= 0, got {shutdown_grace}")
        if on_death is not None and not callable(on_death):
            raise TypeError(f"on_death must be callable, got {type(on_death).__name__}")
        self._on_death = on_death
        # The monitor thread reaches the callback only through a weak reference to this object,
        # so a callback that refers back to the owner does not keep owner and supervisor alive.
        me = weakref.ref(self)
        self._state = SupervisorState(lambda: getattr(me(), "_on_death", None), shutdown_grace)
        self._finalizer = weakref.finalize(self, self._state.shutdown, None)

    # ---- starting ---------------------------------------------------------------------------
    def spawn(self, spec: ChildSpec) -> int:
        """Start one child (spawn method) without waiting; returns its pid."""
        check_main_is_guarded()  # a child re-running an unguarded main script stops here
        state = self._state
        with state.lock:
            if state.stopping:
                raise RuntimeError("this supervisor has been shut down; make a new one")
            if spec.name in state.children:
                raise ValueError(f"a child named {spec.name!r} is already supervised")
        reader, writer = multiprocessing.get_context("spawn").Pipe(duplex=False)
        process = ExplicitEnvProcess(target=child_main, name=spec.name, daemon=False,
                                     args=(spec.target, bytes(spec.args), writer, os.getpid(),
                                           spec.name), child_env=spec.env)
        # Ctrl-C signals the whole foreground group, children included, and children ignore
        # it (run_busy_loop). A child is born with SIGINT blocked (a thread's mask survives
        # fork and exec) until it does, so a Ctrl-C while it bootstraps is no KeyboardInterrupt
        # traceback from the middle of an import either. Only this thread's mask, only for the
        # spawn: the host's own SIGINT handling is untouched. The resource tracker goes first:
        # starting it unblocks SIGINT in the calling thread.
        resource_tracker.ensure_running()
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process.start()
        except BaseException:
            reader.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
            writer.close()  # the child holds its own copy; ours would hide the child's EOF
        state.add(spec.name, process, reader)
        pid = process.pid
        assert pid is not None  # set by start()
        logger.debug("spawned %s (pid %d)", spec.name, pid)
        return pid

    def start(self, specs: Sequence[ChildSpec], timeout: float) -> dict[str, dict[str, Any]]:
        """Spawn ``specs`` and wait for all their READY events; returns ``{name: payload}``.
        On any failure every child of this supervisor is stopped and ``EngineStartupError``
        (child's message and traceback, or its exit code/signal, or the timeout) is raised."""
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"child names must be unique, got {names}")
        try:
            for spec in specs:
                self.spawn(spec)
            return self.wait_ready(timeout, names)
        except BaseException:
            self.shutdown()
            raise

    def wait_ready(self, timeout: float,
                   names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """Block until ``names`` (default: all children) are READY; ``{name: payload}``.
        Raises ``EngineStartupError`` if one reports ERROR, dies, or ``timeout`` passes (it does
        not stop the others; ``start`` does)."""
        return self._state.wait_ready(timeout, names)

    # ---- watching ---------------------------------------------------------------------------
    @property
    def shutdown_grace(self) -> float:
        return self._state.grace

    @property
    def names(self) -> list[str]:
        with self._state.lock:
            return list(self._state.children)

    def pid(self, name: str) -> int:
        return self._state.child(name).process.pid  # type: ignore[return-value]

    def exitcode(self, name: str) -> int | None:
        """None while running; after exit, the code (negative: killed by that signal)."""
        return self._state.child(name).exitcode

    def events(self, name: str) -> list[Event]:
        """The lifecycle events received from ``name`` so far, in order."""
        with self._state.lock:
            return list(self._state.child(name).events)

    def error(self, name: str) -> Event | None:
        """The first ERROR event ``name`` sent (exception type, message, child traceback)."""
        with self._state.lock:
            return self._state.child(name).error

    def check_alive(self) -> None:
        """Raise ``EngineDeadError`` naming the first child that has died (and its error)."""
        with self._state.lock:
            for child in self._state.children.values():
                if child.dead:
                    why = describe_exitcode(child.exitcode)
                    if child.error is not None:
                        why += f" after {child.error.exc_type}: {child.error.message}"
                    raise EngineDeadError(
                        f"child process {child.name!r} (pid {child.process.pid}) died: {why}",
                        process=child.name, exitcode=child.exitcode)

    # ---- stopping ---------------------------------------------------------------------------
    def shutdown(self, grace: float | None = None) -> None:
        """Stop every child; see the class docstring. Safe to call from any thread, repeatedly,
        and from inside the death callback."""
        self._state.shutdown(grace)
        self._finalizer.detach()

    def send_signal(self, name: str, signum: int = signal.SIGTERM) -> None:
        """Signal one child (e.g. SIGTERM to stop just it); a child that is gone is ignored."""
        try:
            os.kill(self.pid(name), signum)
        except ProcessLookupError:
            pass

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

