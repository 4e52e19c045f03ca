"""Start-up cost: the engine process imports no library that only some requests need
(llguidance for constrained ones, tokenizers for detokenize_in="engine"), and the server
imports none of those nor jinja2 before it spawns the engine (its tokenizer and chat template
load after the spawn, while the engine starts)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARIES = ("jinja2", "llguidance", "tokenizers")


@pytest.mark.parametrize("modules", ["aioengine.engine.core_proc, aioengine.engine.core",
                                     "aioengine.server.__main__"])
def test_start_up_imports_leave_out_request_only_libraries(modules: str) -> None:
    code = (f"import sys, {modules}; "
            f"print(sorted(m for m in {LIBRARIES!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_server_app_leaves_out_llguidance() -> None:
    code = "import sys, aioengine.server.app; print('llguidance' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
