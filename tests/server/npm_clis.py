"""Agent CLIs from npm (Claude Code, Codex) for the client tests: installed once into the cache
(``$AIOENGINE_CACHE/npm``) and reused; the test is skipped when npm or the registry is not
there."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from aioengine.config import cache_dir

INSTALL_TIMEOUT = 180  # s; with the CLI's run, within a test's 300 s


def npm_cli(package: str, binary: str) -> str:
    """The path of ``binary`` from ``package``, installed into the cache on first use."""
    prefix = os.path.join(cache_dir(), "npm")
    exe = os.path.join(prefix, "node_modules", ".bin", binary)
    if os.path.exists(exe):
        return exe
    if shutil.which("npm") is None:
        pytest.skip(f"npm is not installed: cannot install {package}")
    os.makedirs(prefix, exist_ok=True)
    try:
        r = subprocess.run(["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund",
                            "--fetch-retries=1", "--fetch-timeout=60000", package],
                           capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install of {package} did not finish in {INSTALL_TIMEOUT} s "
                    "(registry unreachable?)")
    if r.returncode != 0 or not os.path.exists(exe):
        pytest.skip(f"npm could not install {package} (registry unreachable?): "
                    f"{r.stderr.strip()[-300:]}")
    return exe
