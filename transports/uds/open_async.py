"""Opening uds's async endpoints: the asyncio driver's classes (``aio``) on an asyncio loop,
the anyio driver's (``anyio_driver``, imported only then) under trio. Kept apart from both so
neither driver module imports the other's opener."""

from __future__ import annotations

from typing import TypeVar

from transports._anyio_wait import on_asyncio
from transports._deadline import Deadline
from transports.uds import address as A
from transports.uds import core as K
from transports.uds.aio import UdsAsyncReader, UdsAsyncWriter, _AsyncBase

_A = TypeVar("_A", bound=_AsyncBase)


async def _open(cls: type[_A], plan: K.Plan, connect_timeout: float) -> _A:
    if not on_asyncio():  # trio: the anyio driver's endpoints
        from transports.uds import anyio_driver  # imported only under trio

        cls = anyio_driver.ANYIO_CLASSES[cls]  # type: ignore[assignment]
    endpoint = cls(plan.addr, connect_timeout)
    if plan.spec is not None:
        endpoint._core.bind(plan.spec, endpoint)
        endpoint._accept_in_background()
        return endpoint
    sock = await A.connect_async(plan.addr, Deadline(connect_timeout), connect_timeout,
                                 plan.capacity)
    try:
        sock.sendall(plan.hello)  # a fresh connection's buffer takes a hello at once
    except BaseException:
        sock.close()
        raise
    plan.adopt(endpoint._core, sock)
    return endpoint



async def open_async_writer(address: str | None, *, bind: bool, capacity: int,
                            connect_timeout: float) -> UdsAsyncWriter:
    plan = K.plan_writer(address, bind, capacity, connect_timeout)
    return await _open(UdsAsyncWriter, plan, connect_timeout)


async def open_async_reader(address: str | None, *, bind: bool, capacity: int,
                            connect_timeout: float) -> UdsAsyncReader:
    plan = K.plan_reader(address, bind, capacity, connect_timeout)
    return await _open(UdsAsyncReader, plan, connect_timeout)


async def open_async_broadcast_writer(address: str | None, num_readers: int, *, capacity: int,
                                      connect_timeout: float) -> UdsAsyncWriter:
    plan = K.plan_broadcast_writer(address, num_readers, capacity, connect_timeout)
    return await _open(UdsAsyncWriter, plan, connect_timeout)


async def open_async_broadcast_reader(address: str | None, rank: int, *,
                                      connect_timeout: float) -> UdsAsyncReader:
    plan = K.plan_broadcast_reader(address, rank, connect_timeout)
    return await _open(UdsAsyncReader, plan, connect_timeout)
