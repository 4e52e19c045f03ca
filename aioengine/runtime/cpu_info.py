"""The CPU's model name (torch-free: the bench's machine record and the kernels' thread-count
cache both use it)."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """``model name`` of /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
