"""Supervisor after READY: death callbacks, graceful and forced shutdown, garbage collection."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time

import psutil
import pytest

from aioengine.runtime import ChildSpec, EngineDeadError, EventType, Supervisor
from aioengine.runtime.process_tree import wait_gone
from tests.runtime.targets import encode_args

pytestmark = pytest.mark.timeout(90)


def test_sigkill_fires_callback_within_1s_on_the_asyncio_loop():
    async def main() -> tuple[str, int | None, float, str]:
        loop = asyncio.get_running_loop()
        died: asyncio.Future[tuple[str, int | None, float, str]] = loop.create_future()

        def on_death(name: str, code: int | None) -> None:  # monitor thread: hop to the loop
            seen = (name, code, time.monotonic(), threading.current_thread().name)
            loop.call_soon_threadsafe(died.set_result, seen)

        sup = Supervisor(on_death)
        try:
            await asyncio.to_thread(sup.start, [
                ChildSpec("aioengine-test-victim", "tests.runtime.targets:idle"),
                ChildSpec("aioengine-test-bystander", "tests.runtime.targets:idle")], 60)
            victim = psutil.Process(sup.pid("aioengine-test-victim"))
            killed_at = time.monotonic()
            victim.kill()
            # A hang guard (a loaded box): a death noticed only at shutdown never gets here.
            name, code, seen_at, thread = await asyncio.wait_for(died, 60)
            with pytest.raises(EngineDeadError, match=r"aioengine-test-victim.*SIGKILL"):
                sup.check_alive()
        finally:
            await asyncio.to_thread(sup.shutdown)
        assert sup.exitcode("aioengine-test-bystander") == 0
        return name, code, seen_at - killed_at, thread

    name, code, delay, thread = asyncio.run(main())
    assert (name, code) == ("aioengine-test-victim", -signal.SIGKILL)
    # Death detection is event-driven (the monitor thread waits on the child's sentinel), so
    # on an idle box this is milliseconds and the documented contract is 1 s. Asserted here:
    # no polling with a long interval; 10 s leaves a loaded box (2 hogged cores) room for the
    # monitor thread's and the loop's wake-ups without making the test unable to fail.
    assert delay < 10.0, delay
    assert thread == "aioengine-supervisor-monitor"


def test_sigterm_to_one_child_reports_clean_exit_and_callback_may_shut_down():
    deaths: list[tuple[str, int | None]] = []
    done = threading.Event()

    def on_death(name: str, code: int | None) -> None:
        deaths.append((name, code))
        sup.shutdown()  # from the monitor thread itself: must not deadlock
        done.set()

    sup = Supervisor(on_death)
    sup.start([ChildSpec("aioengine-test-a", "tests.runtime.targets:idle"),
               ChildSpec("aioengine-test-b", "tests.runtime.targets:idle")], timeout=60)
    sup.send_signal("aioengine-test-a", signal.SIGTERM)
    assert done.wait(20)
    assert deaths == [("aioengine-test-a", 0)]  # b's stop was ours: no callback
    assert [e.type for e in sup.events("aioengine-test-a")][-2:] == [EventType.SHUTDOWN,
                                                                     EventType.DEAD]
    assert sup.exitcode("aioengine-test-b") == 0


def test_error_after_ready_reaches_callback_error_and_check_alive(tmp_path):
    marker = tmp_path / "cleaned"
    died = threading.Event()
    deaths: list[tuple[str, int | None]] = []
    with Supervisor(lambda n, c: (deaths.append((n, c)), died.set())) as sup:
        sup.start([ChildSpec("aioengine-test-crash", "tests.runtime.targets:failing_step",
                             encode_args(marker=str(marker)))], timeout=60)
        assert died.wait(20)
        assert deaths == [("aioengine-test-crash", 1)]
        error = sup.error("aioengine-test-crash")
        assert error is not None and error.message == "step exploded"
        assert "targets.py" in error.traceback and "in step" in error.traceback
        with pytest.raises(EngineDeadError, match=r"exit code 1 after RuntimeError: step explo"):
            sup.check_alive()
    assert [e.type for e in sup.events("aioengine-test-crash")] == [
        EventType.STARTUP, EventType.READY, EventType.ERROR, EventType.SHUTDOWN, EventType.DEAD]
    assert marker.read_text().startswith("cleaned")


def test_child_ignoring_sigterm_is_killed_with_its_tree_after_the_grace_period():
    sup = Supervisor(shutdown_grace=1.0)
    ready = sup.start([ChildSpec("aioengine-test-stubborn", "tests.runtime.targets:stubborn")],
                      timeout=60)
    grandchild = psutil.Process(ready["aioengine-test-stubborn"]["grandchild"])
    started = time.monotonic()
    sup.shutdown()
    took = time.monotonic() - started
    assert took >= 1.0
    assert sup.exitcode("aioengine-test-stubborn") == -signal.SIGKILL
    assert wait_gone([grandchild], 30) == []  # a hang guard: the tree was SIGKILLed
    types = [e.type for e in sup.events("aioengine-test-stubborn")]
    assert types == [EventType.STARTUP, EventType.READY]  # it never got to SHUTDOWN


@pytest.mark.parametrize("bound", [True, False])
def test_unclosed_supervisor_is_shut_down_when_collected(bound):
    class Owner:
        def __init__(self) -> None:
            # A callback into the owner (bound method or closure) must not keep it alive.
            self.sup = Supervisor(self.on_death if bound else lambda n, c: self.on_death(n, c))

        def on_death(self, name: str, code: int | None) -> None:
            pass

    owner = Owner()
    pid = owner.sup.start([ChildSpec("aioengine-test-orphan", "tests.runtime.targets:idle")],
                          timeout=60)["aioengine-test-orphan"]["pid"]
    proc = psutil.Process(pid)
    del owner
    gc.collect()
    assert wait_gone([proc], 60) == []  # a hang guard: idle never exits on its own


def test_supervisor_installs_no_signal_handlers_in_its_process():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    with Supervisor() as sup:
        sup.start([ChildSpec("aioengine-test-a", "tests.runtime.targets:idle")], timeout=60)
        assert os.getpid() != sup.pid("aioengine-test-a")
    assert {s: signal.getsignal(s) for s in before} == before
