"""Which tensor-parallel rank a layer belongs to. Passed explicitly: no global state of ours."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TPInfo:
    """Rank and size of the tensor-parallel group (the default torch.distributed group)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp_rank must be in [0, {self.size}), got {self.rank}")


def divide(numerator: int, denominator: int, what: str) -> int:
    """``numerator // denominator``, or a ValueError naming ``what`` that does not split."""
    if numerator % denominator != 0:
        raise ValueError(f"{what} ({numerator}) must be divisible by tensor_parallel_size "
                         f"({denominator})")
    return numerator // denominator
