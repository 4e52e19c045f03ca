"""The type checker is part of the test command: mypy, strict on transports/, messages/,
runtime/, client/ and server/ (the configuration is ``[tool.mypy]`` in pyproject.toml)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_is_green(aioengine_cache: str) -> None:
    """mypy starts from the cache of the last green run in the shared test cache (a fresh
    clone's first run took 20-32 s on the 2-core box, a warm one ~3 s; mypy checks each cached
    module by its source's hash, so another clone's cache serves). It runs on a private copy,
    published only when green: two runs at once never share a cache being written."""
    shared = os.path.join(aioengine_cache, "mypy")
    with tempfile.TemporaryDirectory(prefix="aioengine-mypy-") as tmp:
        cache = os.path.join(tmp, "cache")
        if os.path.isdir(shared):
            shutil.copytree(shared, cache)
        done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert "No module named mypy" not in done.stderr, \
            "mypy is not installed: it is in the dev extra (pip install -e '.[dev]')"
        assert done.returncode == 0, f"mypy found errors:\n{done.stdout}{done.stderr}"
        assert "Success: no issues found" in done.stdout
        old = f"{shared}.old-{os.getpid()}"
        with contextlib.suppress(OSError):  # another run publishing at once: keep theirs
            if os.path.isdir(shared):
                os.rename(shared, old)
            os.rename(cache, shared)
        shutil.rmtree(old, ignore_errors=True)
