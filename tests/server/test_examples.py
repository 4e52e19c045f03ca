"""The examples run as written: they stream a reply and exit cleanly."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.server.server_process import ROOT


def _run_example(name: str, *args: str, stdin: str | None = None) -> str:
    """``examples/<name>`` run from the repository root as a user would; it must exit 0. Its
    standard output."""
    r = subprocess.run([sys.executable, os.path.join("examples", name), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, input=stdin,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_embed_in_asyncio_example_streams_and_exits():
    out = _run_example("embed_in_asyncio.py", "Hi")
    last = out.strip().splitlines()[-1]
    assert last.startswith(("[length: 32 tokens]", "[stop: ")), out


def test_chat_terminal_example_answers_on_the_real_model():
    out = _run_example("chat_terminal.py", "--max-tokens", "32",
                       stdin="What is the capital of France?\nAnd of Germany?\n\n")
    first, second = out.strip().splitlines()[:2]
    assert "Paris" in first and "Berlin" in second, out


def test_embed_in_trio_example_streams_and_exits():
    out = _run_example("embed_in_trio.py", "Hi")
    last = out.strip().splitlines()[-1]
    assert last.startswith(("[length: 32 tokens on trio]", "[stop: ")), out
    assert last.endswith("on trio]"), out
