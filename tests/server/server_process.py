"""A real ``python -m aioengine.serve`` child on a free loopback port (``--port 0``; the port
is read from its log), and checks that it leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil

from tests.runtime.leaks import wait_exited
from tests.server.engine_setup import LONG_MAX_MODEL_LEN, LONG_TOKENS

__all__ = ["LONG_CONTEXT", "LONG_TOKENS", "ROOT", "ServerProcess", "wait_for"]

# For a test whose kill, abort or SIGTERM must land while a request still decodes: the
# server's engine gets tiny's whole context (the default here is 256) and the request
# LONG_TOKENS with ignore_eos, seconds of decoding even on an idle box, where ~240 tokens
# (under a second) could end on their own before a loaded box delivered the signal.
LONG_CONTEXT = ("--max-model-len", str(LONG_MAX_MODEL_LEN))  # later flags win: pass as *args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LISTENING = re.compile(r"listening on (https?://[\d.]+:\d+)")


class ServerProcess:
    def __init__(self, *args: str, model: str = "tiny", startup_timeout: float = 180.0) -> None:
        cmd = [sys.executable, "-m", "aioengine.serve", "--model", model, "--device", "cpu",
               "--port", "0", "--max-model-len", "256", "--num-kv-blocks", "256", *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self._url: str | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        if not self._ready.wait(startup_timeout) or self._url is None:
            self.kill()
            raise AssertionError("server did not start:\n" + "".join(self.log))
        self.url = self._url
        self.descendants = psutil.Process(self.proc.pid).children(recursive=True)

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # drained to the end, so the child never blocks on it
            self.log.append(line)
            m = _LISTENING.search(line)
            if m and self._url is None:
                self._url = m.group(1)
                self._ready.set()
        self._ready.set()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait, return the exit code; asserts nothing was left running."""
        self.proc.send_signal(signal.SIGTERM)
        return self.wait_stopped(timeout)

    def wait_stopped(self, timeout: float = 60.0) -> int:
        """After a SIGTERM (``terminate``, or sent by the test itself): wait for the exit,
        return the exit code; asserts nothing was left running."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("server ignored SIGTERM:\n" + "".join(self.log)) from None
        self._reader.join(10)
        self.assert_no_leftovers()
        return rc

    def assert_no_leftovers(self, timeout: float = 10.0) -> None:
        alive = wait_exited(self.descendants, timeout)
        for p in alive:
            p.kill()
        assert not alive, f"processes left behind: {alive}"

    def kill(self) -> None:
        """SIGKILL the server and every process it started."""
        self.proc.kill()
        for p in getattr(self, "descendants", []):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(30)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()

    def output(self) -> str:
        return "".join(self.log)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
