"""A SIGINT that reaches a child while it is still bootstrapping (Ctrl-C signals the whole
process group, a moment after the engine was spawned) is a clean stop, not a
``KeyboardInterrupt`` traceback from the middle of the child's imports: children are born with
SIGINT blocked and unblock it once their handler is in. A fresh interpreter each time, so the
first spawn also starts multiprocessing's resource tracker (which unblocks SIGINT itself)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent("""
    import os, signal, sys, threading, time
    from aioengine.runtime import ChildSpec, Supervisor
    from tests.runtime.targets import encode_args

    NAME = "aioengine-test-sigint"

    def spawn_and_interrupt(sup, out):
        pid = sup.spawn(ChildSpec(NAME, "tests.runtime.targets:idle",
                                  encode_args(marker=sys.argv[1])))
        os.kill(pid, signal.SIGINT)  # it is still starting its interpreter
        out.append(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))

    sup = Supervisor()
    out = []
    where = sys.argv[2]
    if where == "thread":  # as the clients do (asyncio.to_thread)
        t = threading.Thread(target=spawn_and_interrupt, args=(sup, out))
        t.start()
        t.join()
    else:
        spawn_and_interrupt(sup, out)
    deadline = time.monotonic() + 60
    while sup.exitcode(NAME) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    print("spawning thread blocks SIGINT after spawn:", out[0])
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    print("main thread blocks SIGINT:", signal.SIGINT in mask)
    print("exit", sup.exitcode(NAME))
    print("events", " ".join(e.type.value for e in sup.events(NAME)))
    sup.shutdown()
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["main", "thread"])
def test_sigint_while_a_child_bootstraps_stops_it_cleanly(tmp_path, where):
    marker = tmp_path / "cleaned"
    r = subprocess.run([sys.executable, "-c", PROGRAM, str(marker), where], cwd=ROOT,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "spawning thread blocks SIGINT after spawn: False",  # the mask is put back
        "main thread blocks SIGINT: False",
        "exit 0",
        "events STARTUP READY SHUTDOWN DEAD",  # the SIGINT came once the handler was in
    ], r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr
    assert marker.read_text().startswith("cleaned ")
