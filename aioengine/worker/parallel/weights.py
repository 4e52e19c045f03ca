"""How a checkpoint tensor reaches a (sharded) parameter.

A *source* is anything sliceable with a shape: a safetensors ``PySafeSlice`` (reads only the
requested slice from the file) or a plain ``torch.Tensor`` (dummy weights, tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def source_shape(src: Any) -> tuple[int, ...]:
    if isinstance(src, torch.Tensor):
        return tuple(src.shape)
    return tuple(src.get_shape())


def copy_rows(dst: torch.Tensor, src: Any, start: int, length: int) -> None:
    """``dst[:length] = src[start:start+length]`` reading only those rows of ``src``."""
    dst[:length].copy_(src[start:start + length])


def copy_cols(dst: torch.Tensor, src: Any, start: int, length: int) -> None:
    """``dst = src[:, start:start+length]`` reading only those columns of ``src``."""
    dst.copy_(src[:, start:start + length])


def check_shape(name: str, expected: Sequence[int], src: Any) -> None:
    got = source_shape(src)
    if tuple(expected) != got:
        raise ValueError(f"shape mismatch for weight {name!r}: expected {tuple(expected)}, "
                         f"got {got}")
