"""Leak checks for the autouse fixture in tests/conftest.py.

A test leaks if, after a grace wait (which ends as soon as its children are gone), it leaves a
child process (recursive, zombies aside), a new ``/dev/shm`` entry, or a new ``aioengine-*`` or
``aiot-*`` (the transports' names) entry in the temp dir. Entries that a process outside this
test's process tree holds open or mapped belong to someone else (another test run
on a shared machine) and are not ours to report. Leftovers are removed after being reported, so
one bad test does not fail the ones after it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable

import psutil

SHM_DIR = "/dev/shm"
# Temp-dir names of ours: the runtime's and tests' ``aioengine-*``, and the transports' ``aiot-*``
# (their default addresses are abstract sockets now, so any such entry is a leak).
TMP_PREFIXES = ("aioengine-", "aiot-")
# Long-lived helpers that the standard library or torch start once per session, on purpose.
ALLOWED_CHILD_CMDLINES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver",
                          "torch._inductor.compile_worker")


def children() -> set[psutil.Process]:
    try:
        return set(psutil.Process().children(recursive=True))
    except psutil.Error:
        return set()


def _alive_unexpected(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if not any(allowed in cmdline for allowed in ALLOWED_CHILD_CMDLINES):
            out.append(proc)
    return out


def wait_exited(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for ``procs`` to exit; return those still running. A zombie has
    exited: an orphan one (a server's resource tracker once the server is gone) waits for PID 1
    to reap it, which on this box takes up to ~2 s, and ``psutil.wait_procs`` waited for that
    at every server stop."""
    deadline = time.monotonic() + timeout
    procs = list(procs)
    while (running := [p for p in procs if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return running


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} {proc.name()!r}: {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        return f"pid {proc.pid} (gone)"


def _tmp_dirs() -> list[str]:
    return sorted({tempfile.gettempdir(), "/tmp"})


def _listing(ignore: set[str]) -> set[str]:
    entries = set()
    with contextlib.suppress(OSError):
        # Not "sem.*": multiprocessing's named semaphores (spawn-context locks and queues) live
        # there briefly and its resource tracker unlinks any left over.
        entries |= {os.path.join(SHM_DIR, n) for n in os.listdir(SHM_DIR)
                    if not n.startswith("sem.")}
    for tmp in _tmp_dirs():
        with contextlib.suppress(OSError):
            entries |= {os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith(TMP_PREFIXES)}
    return entries - ignore


def _held_by_others(paths: set[str], ours: set[int]) -> set[str]:
    """The subset of ``paths`` (or files under them) open, mapped, or bound as a Unix socket by
    a process not in ``ours``."""
    def owner(target: str) -> str | None:
        for path in paths:
            if target == path or target.startswith(path + "/"):
                return path
        return None

    sockets: dict[str, str] = {}  # inode -> our candidate path
    with contextlib.suppress(OSError), open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if len(cols) >= 8 and (path := owner(cols[7])):
                sockets[f"socket:[{cols[6]}]"] = path
    held: set[str] = set()
    for pid in psutil.pids():
        if pid in ours:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    path = sockets.get(link) or owner(link.removesuffix(" (deleted)"))
                    if path:
                        held.add(path)
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as f:
            for line in f:
                cols = line.split(maxsplit=5)
                if len(cols) == 6 and (path := owner(cols[5].strip())):
                    held.add(path)
    return held


class LeakSnapshot:
    def __init__(self, ignore: Iterable[str] = ()) -> None:
        self.ignore = set(ignore)
        self.children = children()
        self.entries = _listing(self.ignore)

    def finish(self, grace: float = 30.0,
               exclude: Iterable[psutil.Process] = ()) -> list[str]:
        """Wait up to ``grace`` s for new children (other than ``exclude``) to exit, then report
        and remove leftovers. The wait ends as soon as they are gone, so the generous default
        (a hang guard for a loaded box, see conftest.py's ``leak_grace``) costs nothing on a
        clean run."""
        deadline = time.monotonic() + grace
        known = self.children | set(exclude)
        while (new := _alive_unexpected(children() - known)) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        problems = [f"child process left running: {_describe(p)}" for p in new]
        for proc in new:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(new, timeout=3)
        fresh = _listing(self.ignore) - self.entries
        if fresh:
            ours = {os.getpid()} | {p.pid for p in children()}
            fresh -= _held_by_others(fresh, ours)
        for path in sorted(fresh):
            problems.append(f"left behind: {path}")
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        return problems
