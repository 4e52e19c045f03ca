"""The embedding example runs as written: streams a reply and exits cleanly."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.server.server_process import ROOT


def test_embed_in_asyncio_example_streams_and_exits():
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, os.path.join("examples", "embed_in_asyncio.py"), "Hi"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith(("[length: 32 tokens]", "[stop: ")), r.stdout
