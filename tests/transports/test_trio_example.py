"""examples/transports_under_trio.py runs as written: a worker process's blocking writer to an
async reader under trio, every message in order, and a clean exit, on every transport."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("transport", ["shm", "uds", "zmq"])
def test_transports_under_trio_example_runs(transport: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, os.path.join("examples", "transports_under_trio.py"),
                        "3000", transport], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "received 3000 messages in order under trio", r.stdout
