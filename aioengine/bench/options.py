"""What every suite gets from the command line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchOptions:
    quick: bool = False
    model: str = "tiny"
    only: tuple[str, ...] = ()  # restrict a suite to these names (transports, baselines...)
    progress: bool = True

    def wants(self, name: str) -> bool:
        return not self.only or name in self.only
