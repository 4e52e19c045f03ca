"""Send SIGINT to one of aioengine's programs (``python -m aioengine.serve`` / ``.bench``) at a
chosen moment of its life, as a terminal's Ctrl-C does (the whole process group) or as
``kill -INT PID`` does, and collect what it said and every process it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from tests.runtime.leaks import wait_exited

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Interrupted:
    status: int
    lines: list[str]  # stderr
    started: list[psutil.Process]  # every process it had started by the end

    def assert_no_traceback(self) -> None:
        text = "\n".join(self.lines)
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text

    def said(self, needle: str) -> bool:
        return any(needle in line for line in self.lines)


def interrupt_program(cmd: Sequence[str], when: float | str, *, group: bool = True,
                      ready_marker: str = "listening on", timeout: float = 180.0,
                      ) -> Interrupted:
    """Run ``cmd``, SIGINT it ``when`` seconds after the start (``"child"``: once it has a
    child process; ``"ready"``: once a stderr line holds ``ready_marker``), wait for its exit;
    asserts it left no process behind."""
    proc = subprocess.Popen(list(cmd), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:  # drained to the end, so the program never blocks on it
            lines.append(line.rstrip("\n"))
            if ready_marker in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: dict[int, psutil.Process] = {}
    start = time.monotonic()
    try:
        while True:
            with contextlib.suppress(psutil.Error):
                seen.update((c.pid, c) for c in psutil.Process(proc.pid).children(True))
            if (when == "ready" and ready.is_set()) or (when == "child" and seen):
                break
            if isinstance(when, float) and time.monotonic() - start >= when:
                break
            assert proc.poll() is None, "it exited by itself:\n" + "\n".join(lines)
            assert time.monotonic() - start < timeout, "\n".join(lines)
            time.sleep(0.005)
        (os.killpg if group else os.kill)(proc.pid, signal.SIGINT)
        proc.wait(60)
        with contextlib.suppress(psutil.Error):  # a child started after the last look
            seen.update((c.pid, c) for c in psutil.Process(proc.pid).children(True))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        reader.join(10)
    alive = wait_exited(seen.values(), 60)  # returns when they are gone; a loaded box is slow
    for p in alive:
        p.kill()
    assert not alive, f"processes left behind: {alive}\n" + "\n".join(lines)
    return Interrupted(proc.returncode, lines, list(seen.values()))
