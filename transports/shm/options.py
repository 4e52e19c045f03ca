"""Validation of the ``open_*`` arguments, shared by the sync and async constructors."""

from __future__ import annotations

import math

from transports.factory import SHM_DEFAULT_CAPACITY
from transports.shm import segment as S

DEFAULT_CAPACITY = SHM_DEFAULT_CAPACITY  # ring bytes when called directly, as via the factory
DEFAULT_CONNECT_TIMEOUT = 30.0


def check_bind(bind: bool) -> bool:
    if not isinstance(bind, bool):
        raise TypeError(f"bind must be True or False, got {bind!r}")
    return bind


def check_connect_timeout(connect_timeout: float) -> float:
    if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)):
        raise TypeError(f"connect_timeout must be a number of seconds, got {connect_timeout!r}")
    if math.isnan(connect_timeout) or connect_timeout < 0:
        raise ValueError(f"connect_timeout must be >= 0 seconds, got {connect_timeout!r}")
    return float(connect_timeout)


def check_rank(rank: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"rank must be an int, got {rank!r}")
    if not 0 <= rank < S.MAX_READERS:
        raise ValueError(f"rank must be between 0 and {S.MAX_READERS - 1}, got {rank}")
    return rank


capacity = S.check_capacity
num_readers = S.check_num_readers
