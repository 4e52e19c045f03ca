"""Children ignore SIGINT (a terminal's Ctrl-C reaches the whole process group; the parent
decides when they stop), also while they are still bootstrapping, a moment after the spawn:
no ``KeyboardInterrupt`` traceback from the middle of a child's imports, no death by SIGINT.
Children are born with SIGINT blocked and unblock it once they ignore it. A fresh interpreter
each time, so the first spawn also starts multiprocessing's resource tracker (which unblocks
SIGINT itself)."""

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
    sup.wait_ready(60)  # it came up regardless
    os.kill(sup.pid(NAME), signal.SIGINT)  # and once READY, too
    time.sleep(0.5)
    print("spawning thread blocks SIGINT after spawn:", out[0])
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    print("main thread blocks SIGINT:", signal.SIGINT in mask)
    print("running after two SIGINTs:", sup.exitcode(NAME) is None)
    sup.shutdown()  # SIGTERM: the clean stop
    print("exit", sup.exitcode(NAME))
    print("events", " ".join(e.type.value for e in sup.events(NAME)))
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_child_ignores_sigint_from_its_first_moment(tmp_path, where):
    marker = tmp_path / "cleaned"
    r = subprocess.run([sys.executable, "-c", PROGRAM, str(marker), where], cwd=ROOT,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "spawning thread blocks SIGINT after spawn: False",  # the mask is put back
        "main thread blocks SIGINT: False",
        "running after two SIGINTs: True",
        "exit 0",
        "events STARTUP READY SHUTDOWN DEAD",
    ], r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr
    assert marker.read_text().startswith("cleaned ")
