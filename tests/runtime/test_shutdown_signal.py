"""ShutdownSignal: the flag, its fd, and wake-up callbacks (run once, off the caller)."""

from __future__ import annotations

import select
import threading

import pytest

from aioengine.runtime import ShutdownSignal


@pytest.fixture
def sig():
    s = ShutdownSignal()
    yield s
    s.close()


def test_request_sets_flag_event_fd_and_runs_callbacks_once(sig):
    ran: list[str] = []
    threads: list[str] = []
    done = threading.Event()

    def cb() -> None:
        ran.append("a")
        threads.append(threading.current_thread().name)
        done.set()

    sig.add_wakeup(cb)
    assert not sig.requested and not sig.wait(0.01)
    assert select.select([sig.fileno()], [], [], 0)[0] == []
    sig.request("first")
    sig.request("second")
    assert sig.requested and sig.reason == "first"
    assert sig.wait(5) and done.wait(5)
    assert select.select([sig.fileno()], [], [], 5)[0] == [sig.fileno()]
    assert ran == ["a"] and threads == ["aioengine-shutdown"]


def test_late_callback_runs_immediately_and_errors_are_contained(sig, caplog):
    sig.request("stop")
    assert sig.wait(5)
    sig.add_wakeup(lambda: 1 / 0)
    ran: list[int] = []
    sig.add_wakeup(lambda: ran.append(1))
    assert ran == [1]
    assert "wake-up callback" in caplog.text and "ZeroDivisionError" in caplog.text
