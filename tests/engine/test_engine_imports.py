"""Start-up cost: the engine process and the server import no library that only some requests
need (llguidance for constrained ones, tokenizers for detokenize_in="engine")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("modules", ["aioengine.engine.core_proc, aioengine.engine.core",
                                     "aioengine.server.__main__, aioengine.server.app"])
def test_start_up_imports_leave_out_request_only_libraries(modules: str) -> None:
    code = (f"import sys, {modules}; "
            "print(sorted(m for m in ('llguidance', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=True)
    # the server's host process tokenizes: it imports tokenizers itself
    want = "['tokenizers']" if "server" in modules else "[]"
    assert out.stdout.strip() == want
