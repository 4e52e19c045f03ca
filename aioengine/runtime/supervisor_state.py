"""The supervisor's shared state, its monitor thread, READY waiting and the hard stop.

Kept apart from ``Supervisor`` so the monitor thread and the finalizer reference only this
object: a supervisor that is dropped unclosed can still be collected and shut down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_handles
from multiprocessing.process import BaseProcess
from typing import Any

import msgspec

from aioengine.runtime import process_tree
from aioengine.runtime.errors import EngineStartupError, describe_exitcode
from aioengine.runtime.events import Event, EventDecodeError, EventType, decode_event
from aioengine.runtime.supervisor_guard import UNGUARDED_MAIN_EXIT, unguarded_main_message

logger = logging.getLogger(__name__)

CallbackRef = Callable[[], "Callable[[str, int | None], None] | None"]


class ChildState:
    def __init__(self, name: str, process: BaseProcess, reader: Connection) -> None:
        self.name = name
        self.process = process
        self.reader: Connection | None = reader
        self.events: list[Event] = []
        self.ready: dict[str, Any] | None = None
        self.error: Event | None = None
        self.dead = False
        self.exitcode: int | None = None
        """Once dead: the exit code (< 0: killed by that signal); None if reaped elsewhere."""


class SupervisorState:
    def __init__(self, on_death: CallbackRef, grace: float) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.children: dict[str, ChildState] = {}
        self.stopping = False
        self.grace = grace
        self._on_death = on_death
        self._decoder = msgspec.msgpack.Decoder(Event)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._monitor: threading.Thread | None = None
        self._shutdown_lock = threading.Lock()
        self._shut = False

    def child(self, name: str) -> ChildState:
        try:
            return self.children[name]
        except KeyError:
            raise KeyError(f"no child named {name!r}; known: {list(self.children)}") from None

    def add(self, name: str, process: BaseProcess, reader: Connection) -> None:
        with self.lock:
            if not self.stopping:
                self.children[name] = ChildState(name, process, reader)
                if self._monitor is None:
                    self._monitor = threading.Thread(target=self._run_monitor, daemon=True,
                                                     name="aioengine-supervisor-monitor")
                    self._monitor.start()
                self._wake()
                return
        # shutdown() ran while this child was being spawned: it is not ours to keep.
        process.kill()
        process.join()
        reader.close()
        raise RuntimeError(f"the supervisor was shut down while {name!r} was starting")

    def _wake(self) -> None:
        """Interrupt the monitor's wait (it re-reads the child list). Call with ``lock`` held,
        or from ``shutdown`` before the pipe is closed."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    # ---- monitor thread ---------------------------------------------------------------------
    def _run_monitor(self) -> None:
        try:
            self._monitor_loop()
        except Exception:  # a bug here would silently end death detection: make it loud
            logger.exception("supervisor monitor thread failed; child deaths go unnoticed")

    def _monitor_loop(self) -> None:
        while True:
            with self.lock:
                if self.stopping:
                    return
                handles: dict[Any, tuple[ChildState, str]] = {}
                for child in self.children.values():
                    if child.reader is not None:
                        handles[child.reader] = (child, "events")
                    if not child.dead:
                        handles[child.process.sentinel] = (child, "exit")
            ready = wait_handles([self._wake_r, *handles])
            for handle in ready:
                if handle == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                child, kind = handles[handle]
                if kind == "events":
                    self._read_events(child, block=True)
                elif not child.dead:
                    self._on_exit(child)

    def _read_events(self, child: ChildState, *, block: bool) -> None:
        """Read one frame (block=True, the reader is readable) or all that are buffered."""
        while child.reader is not None and (block or child.reader.poll(0)):
            block = False
            try:
                frame = child.reader.recv_bytes()
            except (EOFError, OSError):
                child.reader.close()
                child.reader = None
                return
            try:
                event = decode_event(frame, self._decoder)
            except EventDecodeError as exc:
                logger.error("child %s sent a malformed event: %s", child.name, exc)
                event = Event(type=EventType.ERROR, name=child.name, pid=child.process.pid or 0,
                              time=time.time(), exc_type="EventDecodeError", message=str(exc))
            self._record(child, event)

    def _record(self, child: ChildState, event: Event) -> None:
        logger.debug("event from %s: %s", child.name, event.type.value)
        with self.lock:
            child.events.append(event)
            if event.type is EventType.READY and child.ready is None:
                child.ready = event.payload
            elif event.type is EventType.ERROR and child.error is None:
                child.error = event
            self.cond.notify_all()

    def _on_exit(self, child: ChildState) -> None:
        child.process.join(timeout=1.0)  # the sentinel fired; this reaps it
        self._read_events(child, block=False)  # what it wrote before dying
        with self.lock:
            child.dead = True
            child.exitcode = child.process.exitcode
            fire = not self.stopping
            self.cond.notify_all()
        logger.log(logging.WARNING if fire else logging.DEBUG, "child %s (pid %s) exited: %s",
                   child.name, child.process.pid, describe_exitcode(child.exitcode))
        callback = self._on_death() if fire else None
        if callback is not None:
            try:
                callback(child.name, child.exitcode)
            except Exception:
                logger.exception("death callback for %s failed", child.name)

    # ---- READY ------------------------------------------------------------------------------
    def wait_ready(self, timeout: float, names: Sequence[str] | None) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.cond:
            wanted = list(self.children) if names is None else list(names)
            for name in wanted:
                self.child(name)
            while True:
                if self.stopping:
                    raise EngineStartupError("the supervisor was shut down during startup")
                for name in wanted:
                    self._raise_if_failed(self.children[name])
                if all(self.children[n].ready is not None for n in wanted):
                    return {n: self.children[n].ready for n in wanted}  # type: ignore[misc]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    late = [n for n in wanted if self.children[n].ready is None]
                    raise EngineStartupError(
                        f"child process(es) {late} did not report READY within {timeout:g} s")
                self.cond.wait(remaining)

    @staticmethod
    def _raise_if_failed(child: ChildState) -> None:
        pid = child.process.pid
        if child.error is not None:
            err = child.error
            raise EngineStartupError(
                f"child process {child.name!r} (pid {pid}) failed during startup: "
                f"{err.exc_type}: {err.message}", process=child.name, exitcode=child.exitcode,
                exc_type=err.exc_type, child_message=err.message, child_traceback=err.traceback)
        if child.dead and child.ready is None and child.exitcode == UNGUARDED_MAIN_EXIT:
            raise EngineStartupError(
                f"child process {child.name!r} (pid {pid}) exited before READY: "
                f"{unguarded_main_message()}", process=child.name, exitcode=child.exitcode)
        if child.dead:
            when = "before READY" if child.ready is None else "during startup (after READY)"
            raise EngineStartupError(
                f"child process {child.name!r} (pid {pid}) died {when}: "
                f"{describe_exitcode(child.exitcode)}", process=child.name,
                exitcode=child.exitcode)

    # ---- shutdown ---------------------------------------------------------------------------
    def shutdown(self, grace: float | None) -> None:
        with self._shutdown_lock:  # a concurrent caller waits for the first to finish
            if self._shut:
                return
            grace = self.grace if grace is None else grace
            with self.lock:
                self.stopping = True
                children = list(self.children.values())
                self.cond.notify_all()
                self._wake()
            monitor = self._monitor
            if monitor is not None and monitor is not threading.current_thread():
                monitor.join(timeout=2.0)  # it exits at once unless a callback is running
                if monitor.is_alive():
                    logger.warning("death callback still running; shutting down regardless")
            self._stop(children, grace)
            for child in children:
                if child.reader is not None:
                    child.reader.close()
                    child.reader = None
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._shut = True

    def _stop(self, children: list[ChildState], grace: float) -> None:
        running = [c for c in children if not _exited(c.process)]
        tree = process_tree.descendants(c.process.pid for c in running)  # type: ignore[misc]
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + grace
        self._wait_exits(running, deadline)
        # Orphaned descendants get the rest of the grace period to finish their own cleanup.
        leftover = process_tree.wait_gone(tree, max(0.0, deadline - time.monotonic()))
        stuck = [c for c in running if not _exited(c.process)]
        if stuck or leftover:
            logger.warning("killing processes still alive %g s after SIGTERM: %s", grace,
                           [c.name for c in stuck] + [p.pid for p in leftover])
            late = process_tree.descendants(c.process.pid for c in stuck)  # type: ignore[misc]
            for child in stuck:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            process_tree.kill_all(leftover + late)
            tree = tree + late
        for child in children:
            child.process.join(timeout=5.0)
            self._read_events(child, block=False)
            with self.lock:
                if not child.dead:
                    child.dead = True
                    child.exitcode = child.process.exitcode
        survivors = process_tree.wait_gone(tree, 2.0)
        if survivors:
            logger.error("processes survived SIGKILL: %s", [p.pid for p in survivors])

    def _wait_exits(self, children: list[ChildState], deadline: float) -> None:
        """Wait for the children's sentinels, reading their events meanwhile (a child blocked
        writing a large ERROR frame into a full pipe would never exit otherwise)."""
        pending = {c.process.sentinel: c for c in children}
        while pending and (left := deadline - time.monotonic()) > 0:
            readers = {c.reader: c for c in pending.values() if c.reader is not None}
            for handle in wait_handles([*pending, *readers], left):
                if handle in readers:
                    self._read_events(readers[handle], block=True)
                elif isinstance(handle, int):  # a process sentinel
                    pending.pop(handle, None)


def _exited(process: BaseProcess) -> bool:
    return bool(wait_handles([process.sentinel], 0))
