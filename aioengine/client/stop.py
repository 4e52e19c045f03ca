"""Stop strings: find them in newly decoded text, and hold back a tail that may start one."""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: list[str], include_in_output: bool) -> None:
        self.stops = list(stops)
        self.include = include_in_output
        self._max_len = max((len(s) for s in self.stops), default=0)

    def __bool__(self) -> bool:
        return bool(self.stops)

    def find(self, text: str, new_from: int) -> tuple[int, str] | None:
        """Earliest stop string that ends at or after ``new_from`` (the first new character).
        Returns (length to keep, stop string)."""
        start = max(0, new_from - self._max_len + 1)
        best: tuple[int, str] | None = None
        for stop in self.stops:
            i = text.find(stop, start)
            if i != -1 and (best is None or i < best[0]):
                best = (i, stop)
        if best is None:
            return None
        i, stop = best
        return (i + len(stop) if self.include else i), stop

    def holdback(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of some stop string:
        that text may still turn into a stop string, so it is not released yet."""
        for n in range(min(self._max_len - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0
