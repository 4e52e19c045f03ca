"""Opening zmq's async endpoints: the asyncio driver's classes (``aio``) on an asyncio loop,
the anyio driver's (``anyio_driver``, imported only then) under trio. Kept apart from both so
neither driver module imports the other's opener."""

from __future__ import annotations

from typing import TypeVar

from transports._anyio_wait import on_asyncio
from transports.zmq import core as K
from transports.zmq.aio import ZmqAsyncReader, ZmqAsyncWriter, _AsyncBase

_A = TypeVar("_A", bound=_AsyncBase)


async def _open(cls: type[_A], plan: K.Plan, connect_timeout: float) -> _A:
    """As ``sync._open``; under trio the anyio driver's class of the same role."""
    if not on_asyncio():
        from transports.zmq import anyio_driver  # imported only under trio

        cls = anyio_driver.ANYIO_CLASSES[cls]  # type: ignore[assignment]
    endpoint = cls(plan, connect_timeout)
    if plan.connect:
        try:
            await endpoint._run(endpoint._core.connecting())
        except BaseException:
            endpoint.close()
            raise
    return endpoint


async def open_async_writer(address: str | None, *, bind: bool, capacity: int,
                            connect_timeout: float) -> ZmqAsyncWriter:
    plan = K.plan_writer(address, bind, capacity, connect_timeout)
    return await _open(ZmqAsyncWriter, plan, connect_timeout)


async def open_async_reader(address: str | None, *, bind: bool, capacity: int,
                            connect_timeout: float) -> ZmqAsyncReader:
    plan = K.plan_reader(address, bind, capacity, connect_timeout)
    return await _open(ZmqAsyncReader, plan, connect_timeout)


async def open_async_broadcast_writer(address: str | None, num_readers: int, *, capacity: int,
                                      connect_timeout: float) -> ZmqAsyncWriter:
    plan = K.plan_broadcast_writer(address, num_readers, capacity, connect_timeout)
    return await _open(ZmqAsyncWriter, plan, connect_timeout)


async def open_async_broadcast_reader(address: str | None, rank: int, *,
                                      connect_timeout: float) -> ZmqAsyncReader:
    plan = K.plan_broadcast_reader(address, rank, connect_timeout)
    return await _open(ZmqAsyncReader, plan, connect_timeout)
