"""Children notice their parent's SIGKILL, run their cleanup, and exit (no orphans)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from aioengine.runtime import ChildSpec, EventType, Supervisor
from aioengine.runtime.process_tree import wait_gone
from tests.runtime.targets import encode_args, expected_process_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(90)
def test_sigkill_of_a_supervising_child_takes_its_children_down(tmp_path):
    markers = [str(tmp_path / f"leaf{i}") for i in range(2)]
    deaths: list[tuple[str, int | None]] = []
    with Supervisor(lambda name, code: deaths.append((name, code))) as sup:
        ready = sup.start([ChildSpec("aioengine-test-middle", "tests.runtime.targets:middle",
                                     encode_args(leaf_markers=markers))], timeout=60)
        middle = psutil.Process(ready["aioengine-test-middle"]["pid"])
        # A nested supervisor stops its children faster than the host stops it.
        assert sup.shutdown_grace == 5.0 and ready["aioengine-test-middle"]["grace"] == 3.0
        leaves = [psutil.Process(pid) for pid in ready["aioengine-test-middle"]["leaves"]]
        assert {leaf.ppid() for leaf in leaves} == {middle.pid}
        assert [leaf.name() for leaf in leaves] == [
            expected_process_name(f"aioengine-test-leaf{i}") for i in range(2)]
        killed_at = time.monotonic()
        middle.kill()
        # A hang guard: the leaves are idle targets that never exit on their own, so a leaf that
        # missed its parent's death stays until this gives up.
        assert wait_gone(leaves, 60) == []
        took = time.monotonic() - killed_at
    # Noticing is event-driven (PDEATHSIG, a 0.2 s parent watch): well under a second on an
    # idle box. 30 s leaves a loaded box room for two orphans' cleanup and exit.
    assert took < 30, took
    assert deaths == [("aioengine-test-middle", -signal.SIGKILL)]
    for marker, leaf in zip(markers, leaves, strict=True):
        with open(marker) as f:
            assert f.read() == f"cleaned {leaf.pid}"  # cleanup ran in the orphaned leaf


@pytest.mark.timeout(90)
def test_orphan_with_stuck_cleanup_exits_on_its_own(tmp_path):
    marker = str(tmp_path / "leaf0")
    with Supervisor() as sup:
        ready = sup.start([ChildSpec("aioengine-test-middle", "tests.runtime.targets:middle",
                                     encode_args(leaf_markers=[marker],
                                                 leaf_target="tests.runtime.targets:stuck_cleanup"))],
                          timeout=60)
        leaf = psutil.Process(ready["aioengine-test-middle"]["leaves"][0])
        psutil.Process(ready["aioengine-test-middle"]["pid"]).kill()
        # Its cleanup hangs for 60 s; the parent watch's deadline (1.5 s) ends it instead.
        # 30 s: room for a loaded box, still well short of the 60 s the cleanup would take.
        assert wait_gone([leaf], 30) == []
    with open(marker) as f:
        assert f.read() == f"cleaned {leaf.pid}"


@pytest.mark.timeout(90)
def test_child_outlives_the_parent_thread_that_started_it():
    # PR_SET_PDEATHSIG fires when the starting *thread* exits; the child must check its parent
    # process before shutting down (hosts often start engines from worker threads).
    sup = Supervisor()
    try:
        starter = threading.Thread(target=sup.start, args=(
            [ChildSpec("aioengine-test-threaded", "tests.runtime.targets:idle")], 60))
        starter.start()
        starter.join()
        time.sleep(0.6)  # several parent-watch polls
        sup.check_alive()
        assert [e.type for e in sup.events("aioengine-test-threaded")] == [
            EventType.STARTUP, EventType.READY]
    finally:
        sup.shutdown()


@pytest.mark.timeout(90)
def test_host_exiting_without_shutdown_stops_its_children(tmp_path):
    marker = tmp_path / "cleaned"
    code = ("from aioengine.runtime import ChildSpec, Supervisor\n"
            "from tests.runtime.targets import encode_args, expected_process_name\n"
            "sup = Supervisor()\n"
            "ready = sup.start([ChildSpec('aioengine-test-x', 'tests.runtime.targets:idle', "
            f"encode_args(marker={str(marker)!r}))], timeout=60)\n"
            "print(ready['aioengine-test-x']['pid'], flush=True)\n")  # exits without shutdown
    env = {**os.environ, "PYTHONPATH": ROOT}
    host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert host.returncode == 0, host.stderr
    pid = int(host.stdout)
    assert marker.read_text() == f"cleaned {pid}"  # a clean SIGTERM stop, not a hard kill
    # A hang guard (loaded box): the child was told to stop before the host exited.
    assert wait_gone([psutil.Process(pid)] if psutil.pid_exists(pid) else [], 30) == []
