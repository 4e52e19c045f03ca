"""Fixtures of the bench tests: a real ``python -m aioengine.serve`` on a free port."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"listening on (http://[\d.]+:\d+)")


@pytest.fixture
def serve_url() -> Iterator[str]:
    """The base URL of a tiny-model server; SIGTERM'd (and waited for) afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aioengine.serve", "--model", "tiny", "--port", "0",
         "--max-model-len", "256", "--num-kv-blocks", "128", "--log-level", "INFO"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found: list[str] = []
    log: list[str] = []
    ready = threading.Event()

    def read() -> None:  # drain stderr to the end so the server never blocks on it
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            m = _LISTENING.search(line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not ready.wait(300) or not found:
            raise AssertionError("the server did not start:\n" + "".join(log))
        yield found[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(10)
