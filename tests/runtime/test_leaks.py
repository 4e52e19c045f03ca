"""The leak check behind the autouse fixture: it reports, then removes, what a test leaves."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid

import psutil

from tests.runtime.leaks import LeakSnapshot

CONFTEST = os.path.join(os.path.dirname(os.path.dirname(__file__)), "conftest.py")


def test_reports_and_removes_processes_shm_and_tmp_entries():
    tag = uuid.uuid4().hex[:8]
    snapshot = LeakSnapshot()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    shm = f"/dev/shm/aioengine-leaktest-{tag}"
    tmp = os.path.join(tempfile.gettempdir(), f"aioengine-leaktest-{tag}")
    os.mkdir(tmp)
    # Held open by this process, so a concurrent test run on the same machine sees them as
    # someone else's (ours) and leaves them alone.
    with open(shm, "wb"), open(os.path.join(tmp, "sock"), "wb"):
        started = time.monotonic()
        problems = snapshot.finish(grace=0.2)
    # The 0.2 s grace is honoured: the child sleeps 60 s, so a check that waited for it (or
    # ignored the grace) would take about that long; 30 s leaves room for a loaded box.
    assert time.monotonic() - started < 30
    assert any(f"pid {child.pid}" in p and "child process left running" in p for p in problems)
    assert f"left behind: {shm}" in problems and f"left behind: {tmp}" in problems
    child.wait(5)  # already reaped by the check, which killed it
    assert not psutil.pid_exists(child.pid)
    assert not os.path.exists(shm) and not os.path.exists(tmp)
    assert LeakSnapshot().finish(grace=0) == []


def test_entries_held_by_processes_outside_the_test_are_not_ours():
    path = f"/dev/shm/aioengine-leaktest-{uuid.uuid4().hex[:8]}"
    snapshot = LeakSnapshot()
    # A double fork: the holder is re-parented away, like another test run's process.
    code = ("import os, sys, time\n"
            "if os.fork(): os._exit(0)\n"
            f"f = open({path!r}, 'wb'); print(os.getpid(), flush=True); time.sleep(60)\n")
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    holder = psutil.Process(int(launcher.stdout.readline()))
    launcher.wait(5)
    launcher.stdout.close()
    try:
        assert holder.ppid() != os.getpid()
        assert snapshot.finish(grace=0) == []
        assert os.path.exists(path)
    finally:
        # Unlinked first: an unheld file in /dev/shm is a leak to another test run's checks
        # (an xdist worker's), which would report it against one of its own tests.
        with contextlib.suppress(FileNotFoundError):  # never mask the assertion above
            os.unlink(path)
        holder.kill()
        holder.wait(5) if holder.ppid() == os.getpid() else time.sleep(0.1)


def test_the_autouse_fixtures_fail_leaks_but_not_long_lived_fixtures(pytester, monkeypatch):
    with open(CONFTEST) as f:
        pytester.makeconftest(f.read() + """

import subprocess, sys

def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

@pytest.fixture(scope="session")
def shared():  # first used by a later test of test_a, still alive during test_b
    proc = _sleeper()
    yield proc
    proc.kill()
    proc.wait()

@pytest.fixture(scope="module")
def forgotten():  # never stopped
    return _sleeper()
""")
    pytester.makepyfile(test_a="""
        import subprocess, sys

        def test_leaky():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

        def test_clean():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_uses_shared(shared):
            assert shared.poll() is None
    """, test_b="""
        def test_uses_shared_again(shared):
            assert shared.poll() is None

        def test_uses_forgotten(forgotten):
            assert forgotten.poll() is None
    """)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the inner run is no xdist worker
    result = pytester.runpytest("-p", "no:cacheprovider", "-o", "leak_grace=0.3")
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaky*",
                                 "*test_a.py::test_leaky leaked (now cleaned up)*",
                                 "*child process left running: pid *"])
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_uses_forgotten*",
                                 "*module test_b (its module fixtures) leaked*"])
    assert "the test session" not in result.stdout.str()  # the shared fixture is no leak
