"""The type checker is part of the test command: mypy, strict on transports/, messages/,
runtime/, client/ and server/ (the configuration is ``[tool.mypy]`` in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_is_green() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert "No module named mypy" not in done.stderr, \
        "mypy is not installed: it is in the dev extra (pip install -e '.[dev]')"
    assert done.returncode == 0, f"mypy found errors:\n{done.stdout}{done.stderr}"
    assert "Success: no issues found" in done.stdout
