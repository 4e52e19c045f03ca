"""No process of the peers suite outlives it: the real bench's serving half (our server, and
llama-server where ``$AIOENGINE_LLAMA_CPP`` names a build) stopped by SIGTERM (``timeout``),
SIGINT (Ctrl-C) and SIGKILL while the servers are up; ``procs``' launcher on its own (whole
process groups, timeouts, the parent-death signal); and the ``serve`` suite's engine going with
a terminated or killed bench."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from aioengine.bench.peers import procs

ROOT = Path(__file__).resolve().parents[2]
LLAMA_CPP = os.environ.get("AIOENGINE_LLAMA_CPP")


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, pgid, state) of every process (Linux /proc)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
    return out


def _descendants(pid: int) -> set[int]:
    table = _proc_table()
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, (pp, _, _) in table.items() if pp == p}
        todo += list(kids - found)
        found |= kids
    return found


def _left(pids: set[int], pgids: set[int]) -> list[str]:
    """The processes still alive (zombies count as gone) among ``pids`` or in ``pgids``."""
    return [f"pid {p} (pgid {g}, state {s})" for p, (_, g, s) in _proc_table().items()
            if (p in pids or g in pgids) and s != "Z"]


def _wait_gone(pids: set[int], pgids: set[int], within: float) -> list[str]:
    deadline = time.monotonic() + within
    while (left := _left(pids, pgids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _kill_left(pids: set[int], pgids: set[int]) -> None:
    """Clean up after a failing test (only what it started)."""
    for p, (_, g, s) in _proc_table().items():
        if (p in pids or g in pgids) and s != "Z":
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["sigterm", "sigint", "sigkill"])
def test_the_bench_takes_its_servers_down(signum: int, aioengine_cache: str) -> None:
    """The real ``python -m aioengine.bench peers`` serving half, signalled once every server
    is up: nothing it started is left, by pid or process group."""
    sides = ["--llama-cpp", LLAMA_CPP, "--only", "serve"] if LLAMA_CPP else \
        ["--only", "serve,aioengine"]
    bench = subprocess.Popen(
        [sys.executable, "-m", "aioengine.bench", "peers", "--model", "smollm2-135m-instruct",
         *sides], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # its own group: the signal reaches the bench only
    servers_up = 2 if LLAMA_CPP else 1
    log: list[str] = []
    up = threading.Event()

    def read() -> None:
        assert bench.stderr is not None
        for line in bench.stderr:
            log.append(line)
            if sum("serve_startup_s" in ln for ln in log) >= servers_up:
                up.set()
        up.set()

    threading.Thread(target=read, daemon=True).start()
    pids: set[int] = set()
    pgids: set[int] = set()
    try:
        assert up.wait(300) and bench.poll() is None, "".join(log)
        pids = _descendants(bench.pid)
        table = _proc_table()
        pgids = {table[p][1] for p in pids if p in table} - {bench.pid}
        # the server groups (their own sessions), our server's engine process among them
        assert len(pgids) == servers_up and len(pids) > servers_up, (pids, pgids)
        os.kill(bench.pid, signum)
        code = bench.wait(120)
        if signum == signal.SIGTERM:
            assert code == 128 + signal.SIGTERM, "".join(log)
            assert "peers: terminated by signal 15: stopping" in "".join(log)
            assert _left(pids, pgids) == []  # waited for before the bench exited
        elif signum == signal.SIGINT:
            assert code == 130, "".join(log)
            assert _left(pids, pgids) == []
        else:  # nothing ran in the bench: the parent-death signal did it
            assert code == -signal.SIGKILL
            assert _wait_gone(pids, pgids, 60) == []
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        _kill_left(pids, pgids)


_PARENT = textwrap.dedent("""
    import sys, time
    from aioengine.bench.peers import procs
    # a group of two: the leader shell (which takes a second to go on SIGTERM) and its child
    with procs.guarded():
        child = procs.popen(["sh", "-c", "trap 'sleep 1; exit 0' TERM; sleep 300 & wait"])
        print(child.pid, flush=True)
        time.sleep(300)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, "twice"],
                         ids=["sigterm", "sigkill", "sigterm-twice"])
def test_a_launched_group_dies_with_its_parent(signum) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert parent.stdout is not None
    pgid = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 10
        while len([p for p, (_, g, _) in _proc_table().items() if g == pgid]) < 2:
            assert time.monotonic() < deadline, "the group did not start"
            time.sleep(0.05)
        if signum == "twice":  # the second lands while the first unwinds: no effect
            parent.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            signum = signal.SIGTERM
        parent.send_signal(signum)
        parent.wait(30)
        if signum == signal.SIGTERM:
            assert parent.returncode == 128 + signal.SIGTERM
            assert _left(set(), {pgid}) == []
        else:
            # the shell gets SIGTERM from the kernel and dies; its ``sleep`` is orphaned: the
            # parent-death signal reaches the direct child only (the documented limit)
            assert _wait_gone({pgid}, set(), 10) == []
    finally:
        parent.kill()
        parent.wait()
        _kill_left(set(), {pgid})


def test_stop_takes_the_whole_group_down() -> None:
    proc = procs.popen(["sh", "-c", "trap '' TERM; sleep 300 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len([p for p, (_, g, _) in _proc_table().items() if g == proc.pid]) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        procs.stop(proc, grace=1)  # the shell ignores SIGTERM: SIGKILL after the grace
        assert 0.9 < time.monotonic() - t0 < 10
        assert _left(set(), {proc.pid}) == [] and proc.returncode == -signal.SIGKILL
        assert proc.pid not in procs._live
    finally:
        _kill_left(set(), {proc.pid})


def test_run_stops_a_child_that_times_out() -> None:
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        procs.run(["sh", "-c", "sleep 300 & sleep 300"], timeout=0.5)
    assert time.monotonic() - t0 < 10 and not procs._live
    done = procs.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    with pytest.raises(subprocess.CalledProcessError):
        procs.run(["false"], timeout=30, check=True)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_serve_suite_takes_its_engine_down(signum: int) -> None:
    """``bench serve`` starts no server: its engine processes watch their parent and go with
    the bench, whatever killed it."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "aioengine.bench", "serve", "--quick", "--model", "tiny",
         "--no-progress"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    pids: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not any(_comm(p).startswith("aioengine-engin") for p in pids):
            assert time.monotonic() < deadline and bench.poll() is None, "no engine started"
            time.sleep(0.1)
            pids = _descendants(bench.pid)
        os.kill(bench.pid, signum)
        bench.wait(60)
        assert _wait_gone(pids, set(), 30) == []
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        _kill_left(pids, set())


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
