"""Ctrl-C at any moment of ``python -m aioengine.serve``'s start-up ends it with one line and
status 130, and leaves no process behind; once it serves, SIGINT is the graceful stop (exit 0).
The SIGINT goes to the whole process group, as a terminal's Ctrl-C does, so the children get it
too (the engine may still be bootstrapping its interpreter)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.interrupting import ROOT, interrupt_program

CMD = [sys.executable, "-m", "aioengine.serve", "--model", "tiny", "--device", "cpu",
       "--port", "0", "--max-model-len", "256", "--num-kv-blocks", "64"]
EARLY_LINE = "aioengine.serve: interrupted (SIGINT)"  # while it imports (aiohttp: ~0.5 s)
STARTUP_LINE = "INFO aioengine.serve: SIGINT during start-up: stopping"  # engine starting

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("delay", [0.2, 0.4, 0.8, 1.2, 1.5])
def test_ctrl_c_during_start_up_is_one_line_and_status_130(delay):
    run = interrupt_program(CMD, delay)
    run.assert_no_traceback()
    if run.said("listening on"):  # a fast machine: it was serving already
        assert run.status == 0, run.lines
        return
    assert run.status == 130, run.lines
    assert len(run.lines) == 1, run.lines
    assert run.lines[0] == EARLY_LINE or run.lines[0].endswith(STARTUP_LINE), run.lines


@pytest.mark.parametrize("group", [True, False], ids=["ctrl-c", "kill-int-pid"])
def test_sigint_while_the_engine_starts_stops_it_with_one_line(group):
    # The moment the first child appears: the engine is bootstrapping its interpreter (with
    # the group signal it gets the SIGINT too), long before it is READY.
    run = interrupt_program(CMD, "child", group=group)
    assert run.started
    run.assert_no_traceback()
    assert run.status == 130, run.lines
    assert len(run.lines) == 1 and run.lines[0].endswith(STARTUP_LINE), run.lines


def test_ctrl_c_once_serving_is_the_graceful_stop():
    run = interrupt_program(CMD, "ready")
    assert run.started, "the server started no engine"
    run.assert_no_traceback()
    assert run.status == 0, run.lines
    assert run.lines[-2].endswith(
        "INFO aioengine.serve: SIGINT: stopping (grace period 10.0 s)"), run.lines
    assert run.lines[-1].endswith("INFO aioengine.serve: server stopped"), run.lines


def test_ctrl_c_while_serving_drains_the_request_in_flight():
    # The engine got the Ctrl-C too; it ignores it, so the server's drain can finish the
    # stream (it used to stop at once: 'engine_dead' in the stream and an ERROR line).
    proc = subprocess.Popen([*CMD, "--max-model-len", "1024"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
                break
        assert port is not None, lines
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        body = {"model": "tiny", "prompt": "x", "max_tokens": 400, "ignore_eos": True,
                "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        first = resp.readline()  # the first event: the request is being generated
        assert first.startswith(b"data: "), first
        os.killpg(proc.pid, signal.SIGINT)
        events = [e for e in (first + resp.read()).decode().split("\n\n") if e]
        proc.wait(60)
        lines += [line.rstrip("\n") for line in proc.stderr]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert events[-1] == "data: [DONE]", events[-3:]
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "length", last
    text = "".join(json.loads(e.removeprefix("data: "))["choices"][0]["text"]
                   for e in events[:-1])
    assert text, events[:3]
    assert proc.returncode == 0, lines
    assert not [line for line in lines if " ERROR " in line or " WARNING " in line], lines
    assert lines[-2].endswith("INFO aioengine.serve: SIGINT: stopping (grace period 10.0 s)")
