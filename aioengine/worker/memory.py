"""Giving memory freed by a CPU forward back to the system.

A prefill's temporaries (activations of every token, the float weights a quantized linear
dequantizes for a many-row matmul) are tens of MB; once freed, glibc keeps them in the heap: its
mmap threshold rises to the size of the largest freed block (up to 32 MB), so later ones come
from the heap too, and the heap does not shrink past the fragments: a few prefills left tens to
hundreds of MB resident for good, which ``malloc_trim`` gave back in milliseconds. A fixed small
mmap threshold instead cost a large share of prefill speed (page faults on every large
temporary), so the runner trims after prefill steps, at most once per ``min_interval`` seconds:
a bounded, small cost, and between bursts of prompts the engine holds what its weights, KV cache
and decode steps need (figures: docs/benchmarks.md).
"""

from __future__ import annotations

import time
from typing import Any

from aioengine.runtime.malloc_trim import release_freed_memory


class HeapTrimmer:
    """``after_step(prefill_tokens)``: trim when the step prefilled at least ``min_tokens``
    tokens and the last trim is ``min_interval`` seconds old."""

    def __init__(self, min_tokens: int = 32, min_interval: float = 1.0,
                 clock: Any = time.monotonic) -> None:
        if min_tokens < 1 or min_interval < 0:
            raise ValueError(f"min_tokens must be >= 1 and min_interval >= 0, got "
                             f"{min_tokens} and {min_interval}")
        self.min_tokens = min_tokens
        self.min_interval = min_interval
        self._clock = clock
        self._last = -float("inf")
        self.trims = 0

    def after_step(self, prefill_tokens: int) -> bool:
        if prefill_tokens < self.min_tokens:
            return False
        now = self._clock()
        if now - self._last < self.min_interval:
            return False
        self._last = now
        if release_freed_memory():
            self.trims += 1
            return True
        return False
