"""The examples run as written: they stream a reply and exit cleanly."""

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


def test_chat_terminal_example_answers_on_the_real_model():
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, os.path.join("examples", "chat_terminal.py"),
                        "--max-tokens", "32"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env,
                       input="What is the capital of France?\nAnd of Germany?\n\n")
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()[:2]
    assert "Paris" in first and "Berlin" in second, r.stdout


def test_embed_in_trio_example_streams_and_exits():
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, os.path.join("examples", "embed_in_trio.py"), "Hi"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith(("[length: 32 tokens on trio]", "[stop: ")), r.stdout
    assert last.endswith("on trio]"), r.stdout
