"""Deadline arithmetic shared by every endpoint: one ``timeout`` argument becomes an absolute
monotonic end time, so loops that wait several times never extend the caller's bound."""

from __future__ import annotations

import math
import time


def check_timeout(timeout: float | None, what: str = "timeout") -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, got {timeout!r}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"{what} must be >= 0 seconds or None, got {timeout!r}")


class Deadline:
    """An absolute end time, or none (wait forever)."""

    __slots__ = ("end",)

    def __init__(self, timeout: float | None) -> None:
        check_timeout(timeout)
        self.end = None if timeout is None else time.monotonic() + timeout

    @classmethod
    def earliest(cls, a: Deadline, b: Deadline) -> Deadline:
        d = cls(None)
        ends = [e for e in (a.end, b.end) if e is not None]
        d.end = min(ends) if ends else None
        return d

    def remaining(self) -> float | None:
        """Seconds left (never negative), or None for no bound."""
        if self.end is None:
            return None
        return max(0.0, self.end - time.monotonic())

    def remaining_ms(self) -> int | None:
        """For poll(2)-style APIs: milliseconds left rounded up, or None for no bound."""
        left = self.remaining()
        return None if left is None else math.ceil(left * 1000)

    def expired(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end
