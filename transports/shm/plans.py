"""The ``open_*`` arguments of shm, checked once for every driver: each function returns the
endpoint's core, not yet connected, and whether the driver must connect it to the binder
(``core.adopt`` of ``rendezvous.connect``/``connect_async``, which is where the drivers
differ)."""

from __future__ import annotations

from transports.shm import options
from transports.shm.address import parse_name
from transports.shm.reader_core import ReaderCore
from transports.shm.writer_core import WriterCore


def writer(address: str | None, bind: bool, capacity: int,
           connect_timeout: float) -> tuple[WriterCore, bool]:
    name, bind = parse_name(address), options.check_bind(bind)
    cap, wait = options.capacity(capacity), options.check_connect_timeout(connect_timeout)
    return WriterCore(name, cap, 1, wait, bind), not bind


def reader(address: str | None, bind: bool, capacity: int,
           connect_timeout: float) -> tuple[ReaderCore, bool]:
    """``capacity`` is chosen by the writer (it creates the ring); it is validated here only."""
    name, bind = parse_name(address), options.check_bind(bind)
    options.capacity(capacity)
    return ReaderCore(name, 0, options.check_connect_timeout(connect_timeout), bind), not bind


def broadcast_writer(address: str | None, num_readers: int, capacity: int,
                     connect_timeout: float) -> tuple[WriterCore, bool]:
    name, n = parse_name(address), options.num_readers(num_readers)
    cap, wait = options.capacity(capacity), options.check_connect_timeout(connect_timeout)
    return WriterCore(name, cap, n, wait, bind=True), False


def broadcast_reader(address: str | None, rank: int,
                     connect_timeout: float) -> tuple[ReaderCore, bool]:
    if address is None:
        raise ValueError("a broadcast reader needs the writer's address (shm://NAME)")
    name, rank = parse_name(address), options.check_rank(rank)
    return ReaderCore(name, rank, options.check_connect_timeout(connect_timeout),
                      bind=False), True
