"""Finding and ending a process's descendants (psutil), for the supervisor's hard stop; the
resident memory of named processes, for the stats."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable

import psutil

from aioengine.messages.engine_io import ProcessMemory

logger = logging.getLogger(__name__)


def descendants(pids: Iterable[int]) -> list[psutil.Process]:
    """Every live descendant of ``pids`` (children of children too). psutil.Process objects
    remember their start time, so signalling them later cannot hit a reused pid."""
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            for child in psutil.Process(pid).children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            continue
    return list(found.values())


def is_gone(proc: psutil.Process) -> bool:
    """Exited (a zombie counts: it holds nothing but its pid until its new parent reaps it)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def kill_all(procs: Iterable[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if not is_gone(proc):
                logger.warning("killing leftover process %d (%s)", proc.pid, _name(proc))
                proc.kill()


def wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Poll until every process is gone or ``timeout`` passes; returns the ones still alive.
    (Not ``psutil.wait_procs``: orphans are not our children, and polling also treats zombies
    left for another reaper as gone.)"""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not is_gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if not is_gone(p)]
    return alive


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return "?"


def resident_memory(pids: dict[str, int]) -> list[ProcessMemory]:
    """The resident set size of each live process of ``{role: pid}`` (one that is gone is left
    out: its memory is back)."""
    found = []
    for role, pid in pids.items():
        try:
            rss = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
        found.append(ProcessMemory(role=role, pid=pid, rss_bytes=int(rss)))
    return found
