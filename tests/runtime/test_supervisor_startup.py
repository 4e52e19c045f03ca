"""Supervisor startup: READY payloads, and EngineStartupError for every way a child can fail."""

from __future__ import annotations

import re
import threading
import time

import psutil
import pytest

from aioengine.runtime import ChildSpec, EngineStartupError, EventType, Supervisor
from tests.runtime.targets import encode_args

pytestmark = pytest.mark.timeout(90)


def _targets_line() -> int:
    """The line of ``raise ValueError("boom")`` in targets.py, looked up, not hard-coded."""
    import tests.runtime.targets as targets

    with open(targets.__file__) as f:
        return next(i for i, line in enumerate(f, 1) if 'raise ValueError("boom")' in line)


def test_start_returns_ready_payloads_and_events_in_order():
    sup = Supervisor()
    try:
        ready = sup.start([ChildSpec("aioengine-test-a", "tests.runtime.targets:idle",
                                     encode_args(payload={"address": "shm://a"})),
                           ChildSpec("aioengine-test-b", "tests.runtime.targets:idle")],
                          timeout=60)
        assert ready == {"aioengine-test-a": {"pid": sup.pid("aioengine-test-a"),
                                              "address": "shm://a"},
                         "aioengine-test-b": {"pid": sup.pid("aioengine-test-b")}}
        sup.check_alive()
    finally:
        sup.shutdown()
    for name in ("aioengine-test-a", "aioengine-test-b"):
        assert [e.type for e in sup.events(name)] == [
            EventType.STARTUP, EventType.READY, EventType.SHUTDOWN, EventType.DEAD]
        assert sup.exitcode(name) == 0
    sup.shutdown()  # idempotent


def test_init_error_carries_message_and_child_file_and_line():
    sup = Supervisor()
    with pytest.raises(EngineStartupError) as info:
        sup.start([ChildSpec("aioengine-test-ok", "tests.runtime.targets:idle"),
                   ChildSpec("aioengine-test-boom", "tests.runtime.targets:failing_init")],
                  timeout=60)
    err = info.value
    text = str(err)
    assert "boom" in text and "ValueError" in text and "aioengine-test-boom" in text
    assert re.search(rf'targets\.py", line {_targets_line()}, in init', text), text
    assert err.process == "aioengine-test-boom" and err.child_message == "boom"
    # start() stopped everything, including the healthy sibling.
    for name in sup.names:
        assert sup.exitcode(name) is not None
        assert not psutil.pid_exists(sup.pid(name)) or \
            psutil.Process(sup.pid(name)).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("target, needles", [
    ("tests.runtime.targets:exit_in_init", ["died before READY", "exit code 3"]),
    ("tests.runtime.no_such_module:factory", ["ModuleNotFoundError", "no_such_module"]),
    ("tests.runtime.targets:nope", ["AttributeError", "has no attribute 'nope'"]),
    ("tests.runtime.targets:not_a_target", ["TypeError", "not a BusyLoopTarget"]),
    ("tests.runtime.targets:bad_payload", ["TypeError", "not msgpack-encodable"]),
])
def test_startup_failures_name_their_cause(target, needles):
    with pytest.raises(EngineStartupError) as info:
        Supervisor().start([ChildSpec("aioengine-test-bad", target)], timeout=60)
    for needle in needles:
        assert needle in str(info.value)


def test_child_killed_before_ready_names_the_signal():
    sup = Supervisor()
    try:
        pid = sup.spawn(ChildSpec("aioengine-test-slow", "tests.runtime.targets:slow_init"))
        psutil.Process(pid).kill()
        with pytest.raises(EngineStartupError, match=r"died before READY: killed by signal "
                                                     r"SIGKILL \(-9\)"):
            sup.wait_ready(60)
    finally:
        sup.shutdown()


def test_ready_timeout_is_an_error_and_start_cleans_up():
    sup = Supervisor()
    with pytest.raises(EngineStartupError, match=r"\['aioengine-test-slow'\] did not report "
                                                 r"READY within 0.5 s"):
        sup.start([ChildSpec("aioengine-test-slow", "tests.runtime.targets:slow_init")],
                  timeout=0.5)
    assert sup.exitcode("aioengine-test-slow") is not None  # stopped, however far it got


def test_sigterm_after_startup_interrupts_a_slow_init_cleanly():
    with Supervisor() as sup:
        sup.spawn(ChildSpec("aioengine-test-slow", "tests.runtime.targets:slow_init"))
        deadline = time.monotonic() + 60
        while not sup.events("aioengine-test-slow") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sup.events("aioengine-test-slow")[0].type is EventType.STARTUP
        with pytest.raises(EngineStartupError, match=r"did not report READY within 0\.3 s"):
            sup.wait_ready(0.3)
    assert sup.exitcode("aioengine-test-slow") == 0  # its handler woke init's wait


@pytest.mark.parametrize("target", ["busy_factory", "busy_init"])
def test_sigterm_stops_a_start_up_that_does_not_look_at_the_flag(target, tmp_path):
    # Imports and model loads never look at the shutdown flag: a SIGTERM during start-up
    # unwinds them, so the child stops itself (exit 0, cleanup run when it had an instance)
    # instead of being SIGKILLed after the grace period, or outliving a parent that gave up.
    marker = tmp_path / "cleaned"
    started = tmp_path / "started"  # written as the factory / init begins its busy work
    sup = Supervisor(shutdown_grace=30)
    sup.spawn(ChildSpec("aioengine-test-busy", f"tests.runtime.targets:{target}",
                        encode_args(marker=str(marker), started=str(started))))
    # A state, not a time: STARTUP is sent before the target module is imported and the
    # factory called, so only the child's own "started" file says it is inside the factory /
    # init (for busy_init: an instance exists, so its cleanup must run). 60 s: a hang guard for
    # a loaded box; the busy work lasts 60 s, so the SIGTERM lands inside it.
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started.exists(), "the child never began its busy start-up"
    sup.shutdown()  # SIGTERM, then up to 30 s before a SIGKILL
    assert sup.exitcode("aioengine-test-busy") == 0
    assert [e.type for e in sup.events("aioengine-test-busy")] == [
        EventType.STARTUP, EventType.SHUTDOWN, EventType.DEAD]
    assert marker.exists() == (target == "busy_init")


@pytest.mark.parametrize("kwargs, error, needle", [
    ({"name": "", "target": "a.b:c"}, ValueError, "non-empty printable"),
    ({"name": "x", "target": "a.b.c"}, ValueError, "package.module:factory"),
    ({"name": "x", "target": ":c"}, ValueError, "package.module:factory"),
    ({"name": "x", "target": 3}, TypeError, "'module:qualname' str or a callable"),
    ({"name": "x", "target": lambda raw: None}, ValueError, "module-level callable"),
    ({"name": "x", "target": "a.b:c", "args": "text"}, TypeError, "must be bytes"),
])
def test_bad_child_specs_are_rejected_in_the_parent(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        ChildSpec(**kwargs)


def test_bad_supervisor_use_is_rejected():
    with pytest.raises(ValueError, match="shutdown_grace"):
        Supervisor(shutdown_grace=-1)
    with pytest.raises(TypeError, match="on_death must be callable"):
        Supervisor(on_death=3)  # type: ignore[arg-type]
    sup = Supervisor()
    spec = ChildSpec("aioengine-test-dup", "tests.runtime.targets:idle")
    with pytest.raises(ValueError, match="unique"):
        sup.start([spec, spec], timeout=5)
    sup.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        sup.spawn(spec)
    with pytest.raises(KeyError, match="no child named 'nobody'"):
        sup.pid("nobody")


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_shutdown_racing_a_spawn_leaves_no_child(delay):
    sup = Supervisor()
    outcome: list[object] = []

    def spawn() -> None:
        try:
            outcome.append(sup.spawn(ChildSpec("aioengine-test-race",
                                               "tests.runtime.targets:idle")))
        except RuntimeError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=spawn)
    thread.start()
    time.sleep(delay)  # 0: usually shuts down mid-spawn; 0.05: usually after it
    sup.shutdown()
    thread.join(30)
    assert len(outcome) == 1
    if isinstance(outcome[0], RuntimeError):
        assert "shut down" in str(outcome[0])
    else:  # the spawn won the race: shutdown stopped the child
        assert sup.exitcode("aioengine-test-race") is not None
    # Either way the autouse leak check proves no process is left behind.
