"""One child's lifecycle, read straight off its event pipe with plain msgpack (no Supervisor)."""

from __future__ import annotations

import multiprocessing
import os
import signal

import msgpack
import psutil
import pytest

from aioengine.runtime import child_main, run_busy_loop
from tests.runtime.targets import encode_args, expected_process_name

NAME = "aioengine-test-lifecycle"


def _spawn(target: str, args: bytes):
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child_main, args=(target, args, writer, os.getpid(), NAME))
    proc.start()
    writer.close()
    return proc, reader


def _read_all(reader) -> list[dict]:
    frames = []
    while True:
        try:
            frames.append(msgpack.unpackb(reader.recv_bytes()))
        except EOFError:
            return frames


@pytest.mark.timeout(60)
def test_sigterm_wakes_a_blocked_step_then_shutdown_dead_exit_0_and_cleanup(tmp_path):
    marker = tmp_path / "cleaned"
    proc, reader = _spawn("tests.runtime.targets:blocked_recv", encode_args(marker=str(marker)))
    try:
        startup = msgpack.unpackb(reader.recv_bytes())
        ready = msgpack.unpackb(reader.recv_bytes())
        assert (startup["type"], ready["type"]) == ("STARTUP", "READY")
        assert ready["payload"] == {"pid": proc.pid} and ready["name"] == NAME
        assert psutil.Process(proc.pid).name() == expected_process_name(NAME)
        os.kill(proc.pid, signal.SIGTERM)  # its step is blocked in recv() with no timeout
        rest = _read_all(reader)
        proc.join(10)
    finally:
        if proc.exitcode is None:
            proc.kill()
            proc.join()
        reader.close()
    assert [e["type"] for e in rest] == ["SHUTDOWN", "DEAD"]
    assert rest[1]["exit_code"] == 0 and proc.exitcode == 0
    assert marker.read_text() == f"cleaned {proc.pid}"


@pytest.mark.timeout(60)
def test_error_in_init_reports_error_then_shutdown_dead_exit_1():
    proc, reader = _spawn("tests.runtime.targets:failing_init", b"")
    try:
        events = _read_all(reader)
        proc.join(10)
    finally:
        reader.close()
    assert [e["type"] for e in events] == ["STARTUP", "ERROR", "SHUTDOWN", "DEAD"]
    error = events[1]
    assert error["exc_type"] == "ValueError" and error["message"] == "boom"
    assert "targets.py" in error["traceback"] and 'raise ValueError("boom")' in error["traceback"]
    assert events[3]["exit_code"] == 1 and proc.exitcode == 1


def test_run_busy_loop_refuses_to_run_in_the_host_process():
    reader, writer = multiprocessing.Pipe(duplex=False)
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(RuntimeError, match="only in a child process"):
            run_busy_loop("tests.runtime.targets:idle", b"", writer, os.getppid(), NAME)
    finally:
        reader.close()
        writer.close()
    assert signal.getsignal(signal.SIGTERM) is before
