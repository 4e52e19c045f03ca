"""The host process: never imports torch, installs no signal handler, runs two clients side by
side under uvloop; text from the engine and from a detokenizer process equals the tokens' text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from aioengine.client.tokenizer import Tokenizer
from aioengine.hub import resolve_model

SCRIPT = os.path.join(os.path.dirname(__file__), "side_by_side.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_two_clients_uvloop_no_torch_in_host() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    proc = subprocess.run([sys.executable, SCRIPT, "zmq", "engine", "shm", "process"],
                          capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["torch"] is False
    assert result["loop"].startswith("uvloop")
    assert result["signal_handlers_added"] == 0
    assert result["shut_down_alive"] == []
    assert len(result["forgotten_pids"]) == 2  # engine + detokenizer, never shut down...
    assert result["forgotten_alive"] == []  # ...yet stopped by the client's finalizer
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before

    tok = Tokenizer.from_dir(resolve_model("tiny").tokenizer_path)
    for a, b in zip(result["a"], result["b"], strict=True):
        assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) == 12
        for r in (a, b):
            assert "".join(r["deltas"]) == r["text"] == tok.decode(r["token_ids"])
            assert not any(d.endswith("\ufffd") for d in r["deltas"])


@pytest.mark.parametrize("module", ["aioengine", "aioengine.client.async_client"])
def test_import_does_not_import_torch(module: str) -> None:
    code = (f"import sys, {module}; from aioengine import AsyncMPClient, LLM, RequestOutput; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
