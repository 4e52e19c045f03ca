"""glibc's ``malloc_trim``: hand memory the allocator keeps after frees back to the system (the
host after tokenizing a huge text, the engine after a prefill's temporaries); a no-op elsewhere."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): nothing to do
        return None


def release_freed_memory() -> bool:
    """``malloc_trim(0)`` (every arena); False where there is none (a no-op)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
