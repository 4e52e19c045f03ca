"""aioengine.program_interrupt in real interpreters: SIGINT ends a program with one line and
status 130 at once while it imports; once it unwinds instead, a clean-up that swallows the
``KeyboardInterrupt`` or hangs is cut short by a second SIGINT or by the deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.interrupting import ROOT

LINE = "prog: interrupted (SIGINT)"
HANGING = textwrap.dedent("""
    import sys, time
    from aioengine.program_interrupt import exit_at_once_on_sigint, unwind_on_sigint
    exit_at_once_on_sigint("prog")
    if sys.argv[1] == "unwind":
        unwind_on_sigint("prog", deadline=int(sys.argv[2]))
    ready = False
    while True:  # a clean-up that never finishes: it swallows KeyboardInterrupt
        try:
            if not ready:  # said inside the try: the first SIGINT lands in it
                ready = True
                print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("unwinding", flush=True)
""")


def run_hanging(*args: str, signals: int) -> tuple[int, str, str, float]:
    proc = subprocess.Popen([sys.executable, "-c", HANGING, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        start = time.monotonic()
        seen = ""
        for i in range(signals):
            os.kill(proc.pid, signal.SIGINT)
            if i < signals - 1:
                # A state, not a time: the next SIGINT must land while it unwinds, i.e. after
                # it said so. If it exited instead, readline gets "" and this fails at once;
                # the test's timeout guards a child that neither says it nor exits.
                seen += proc.stdout.readline()
                assert seen.endswith("unwinding\n"), seen
        proc.wait(30)
        out, err = proc.communicate()
        out = seen + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return proc.returncode, out, err, time.monotonic() - start


@pytest.mark.timeout(60)
def test_exit_at_once():
    status, out, err, took = run_hanging("once", signals=1)
    assert (status, out, err) == (130, "", LINE + "\n")
    # Its sleep is 60 s, so anything well under that is "at once"; 30 s leaves a loaded box room
    # for the signal, the exit and the reap.
    assert took < 30, took


@pytest.mark.timeout(60)
def test_unwinding_then_a_second_sigint_exits_at_once():
    # The deadline is far beyond run_hanging's 30 s wait: only the second SIGINT can end it in
    # time (with a 30 s deadline a lost second SIGINT would look the same).
    status, out, err, _ = run_hanging("unwind", "600", signals=2)
    assert (status, out, err) == (130, "unwinding\n", LINE + "\n")


@pytest.mark.timeout(60)
def test_unwinding_that_hangs_ends_at_the_deadline():
    status, out, err, took = run_hanging("unwind", "2", signals=1)
    assert (status, out, err) == (130, "unwinding\n", LINE + "\n")
    assert 1.5 < took < 20, took


def test_a_callers_own_handler_is_left_alone():
    code = textwrap.dedent("""
        import signal
        from aioengine.program_interrupt import unwind_on_sigint, unwound
        mine = lambda *_: None
        signal.signal(signal.SIGINT, mine)
        signal.alarm(100)
        unwind_on_sigint("prog", deadline=1)
        unwound()
        assert signal.getsignal(signal.SIGINT) is mine
        assert signal.alarm(0) > 90  # the caller's own alarm was not cancelled
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
