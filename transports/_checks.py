"""Validation of the ``open_*`` arguments of the socket transports (uds, zmq), shared by their
sync and async constructors. (shm checks its own, against its ring's limits.)"""

from __future__ import annotations

from transports._deadline import check_timeout


def check_args(capacity: int, connect_timeout: float) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"capacity must be a positive number of bytes, got {capacity!r}")
    check_timeout(connect_timeout, "connect_timeout")


def check_num_readers(num_readers: int) -> None:
    if isinstance(num_readers, bool) or not isinstance(num_readers, int) or num_readers < 1:
        raise ValueError(f"num_readers must be a positive int, got {num_readers!r}")


def check_rank(rank: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
