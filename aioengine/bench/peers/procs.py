"""The ``peers`` suite's child processes (servers, llama.cpp's tools, our measuring children,
the llama.cpp build): none outlives the bench.

Each starts in its own session (a terminal's Ctrl-C reaches the bench only, which stops them in
order) with the kernel's parent-death signal set (``PR_SET_PDEATHSIG``: a bench killed with
SIGKILL, or one that ``_exit``s, still takes them down), and is registered while it runs.
``guarded()`` (entered by ``peers.run`` and the serving half) turns SIGTERM into an unwinding:
the handler sends SIGTERM to every registered process group at once, then raises
``Terminated`` so every ``finally`` waits for its group (SIGKILL after ``GRACE`` seconds).
SIGINT unwinds through ``KeyboardInterrupt`` the same way.

The parent-death signal fires when the *thread* that started the child exits: the suite starts
its children from the main thread. It reaches the direct child only; a group's other members
(an ``aioengine.serve``'s engine process, a build's compilers) depend on that child's own
handling of it (our server shuts its engine down on SIGTERM).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

GRACE = 20.0
"""Seconds a stopped group gets between SIGTERM and SIGKILL."""

PR_SET_PDEATHSIG = 1

_live: dict[int, subprocess.Popen] = {}
_lock = threading.Lock()


class Terminated(SystemExit):
    """The bench got SIGTERM (``guarded``): its children were signalled; unwinding waits."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return libc.prctl


def _before_exec(parent: int, death_signal: int):
    """The child's first act after ``fork``: the parent-death signal, then a check that the
    parent did not die before it was set (nothing is loaded here: ``prctl`` is resolved in
    the parent, so no lock another thread held at the fork is needed)."""
    prctl = _prctl()

    def before_exec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return before_exec


def popen(cmd: Sequence[str], *, death_signal: int = signal.SIGTERM,
          **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` in a session of its own, ``death_signal`` when the bench dies,
    registered until ``stop``."""
    proc = subprocess.Popen(list(cmd), start_new_session=True,
                            preexec_fn=_before_exec(os.getpid(), death_signal), **kwargs)
    with _lock:
        _live[proc.pid] = proc
    return proc


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_alive(pgid: int) -> bool:
    """Whether any process other than a zombie is left in process group ``pgid`` (Linux
    ``/proc``; ``killpg(pgid, 0)`` also counts zombies nobody has reaped yet)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _wait_group(proc: subprocess.Popen, deadline: float) -> bool:
    while time.monotonic() < deadline:
        proc.poll()  # reaps the leader
        if not group_alive(proc.pid):
            return True
        time.sleep(0.05)
    return False


def stop(proc: subprocess.Popen, grace: float = GRACE) -> None:
    """SIGTERM to ``proc``'s whole process group, SIGKILL to what is left ``grace`` seconds
    later, and wait until none of the group is left (the leader reaped)."""
    if _signal_group(proc.pid, signal.SIGTERM) and not _wait_group(
            proc, time.monotonic() + grace):
        _signal_group(proc.pid, signal.SIGKILL)
        _wait_group(proc, time.monotonic() + 10)
    try:
        proc.wait(10)
    finally:
        with _lock:
            _live.pop(proc.pid, None)


def stop_all(grace: float = GRACE) -> None:
    with _lock:
        procs = list(_live.values())
    for proc in procs:
        stop(proc, grace)


def run(cmd: Sequence[str], *, timeout: float, check: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=...)`` through ``popen``:
    the child's group is stopped however this returns (a timeout, ``Terminated``, Ctrl-C)."""
    proc = popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop(proc, grace=5)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


_terminating = False


def _on_sigterm(signum: int, _frame: FrameType | None) -> None:
    global _terminating
    pgids = list(_live)  # no lock: the main thread this runs on may hold it
    for pgid in pgids:  # at once; the unwinding's ``finally`` blocks wait for them
        _signal_group(pgid, signal.SIGTERM)
    if _terminating:  # a second SIGTERM must not cut the waiting short (SIGKILL does)
        return
    _terminating = True
    os.write(2, f"peers: terminated by signal {signum}: stopping {len(pgids)} child "
                f"process group(s)\n".encode())
    raise Terminated(signum)


@contextmanager
def guarded() -> Iterator[None]:
    """SIGTERM unwinds (``Terminated``) while inside, and every child still registered at the
    end is stopped. The outermost use on the main thread does both; nested ones (and any off
    the main thread, where no handler can be installed) nothing."""
    global _terminating
    install = threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGTERM) is not _on_sigterm
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if install else None
    _terminating = _terminating and not install
    try:
        yield
    finally:
        try:
            if install:
                stop_all()
        finally:
            if install:
                signal.signal(signal.SIGTERM, previous)
