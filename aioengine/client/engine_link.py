"""The client's side of its engines' channels: what is open (streams by id, pending utility
calls), the replicas and their deaths, and everything that goes out (requests, aborts, utility
calls), on the event loop that started the client.

``AsyncMPClient`` holds one ``EngineLink`` and keeps only its public API; the calls that span
replicas (``dp/replica_calls``) take the link, so neither module needs the client's class.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from aioengine.client.backend_types import Backend, CallFuture, TaskHandle
from aioengine.client.dp.replicas import Replica
from aioengine.client.dp.router import PrefixRouter
from aioengine.client.engine_death import EngineDeath
from aioengine.client.launch import EngineProcess
from aioengine.client.request_stream import RequestStream
from aioengine.config import EngineConfig
from aioengine.messages.engine_io import AbortRequests, ClientMessage, UtilityCall
from aioengine.runtime.errors import EngineDeadError
from transports.errors import TransportError


class EngineLink:
    """Everything the client's streams and calls share; bound to a loop by ``start()``."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.streams: dict[str, RequestStream] = {}  # by the caller's request id
        self.by_wire: dict[str, RequestStream] = {}  # by the id the engine knows
        self.wire_seq = itertools.count()
        self.calls: dict[int, CallFuture] = {}
        self._call_ids = itertools.count()
        self._pending_aborts: list[tuple[int, str]] = []  # (replica, wire id)
        self.background: set[TaskHandle] = set()
        self.output_tasks: list[TaskHandle] = []
        self.replicas: list[Replica] = []  # one engine each (``client/dp``)
        self.pick: PrefixRouter | None = None  # with data parallelism only
        self.engine: EngineProcess | None = None  # replica 0's
        self.backend: Backend | None = None  # the loop that started the client
        self.death = EngineDeath(self.streams, self.calls)
        self.closed = False
        self._encoder = msgspec.msgpack.Encoder()

    # ---- checks -------------------------------------------------------------------------
    def check_started(self) -> None:
        if self.engine is None:
            raise RuntimeError("the client is not started: use 'async with AsyncMPClient(...)' "
                               "or 'await client.start()'")

    def check_alive(self) -> None:
        self.check_started()
        if self.death.error is not None:
            raise self.death.fresh_error()

    def check_loop(self) -> None:
        """The output task, events and futures all live on the loop that started the client;
        from another loop a stream would never be woken."""
        backend = self.backend
        if backend is None or not backend.is_current():
            raise RuntimeError(
                "this AsyncMPClient is used from an event loop other than the one it was "
                f"started on ({backend!r}); use it only from that loop (from another "
                "thread: asyncio.run_coroutine_threadsafe, or trio.from_thread.run), or give "
                "this loop its own client")

    def live(self) -> list[Replica]:
        """The replicas serving (all, unless one died in ``degrade`` mode)."""
        return [r for r in self.replicas if r.load.alive and r.death.error is None]

    # ---- sending ------------------------------------------------------------------------
    async def send(self, msg: ClientMessage, replica: Replica) -> None:
        assert replica.engine is not None
        frame = self._encoder.encode(msg)
        death = replica.death
        try:
            async with replica.send_lock:
                if self.death.error is not None:
                    raise self.death.fresh_error()
                if death.error is not None:
                    raise death.fresh_error()
                await replica.engine.requests.send(frame)
        except TransportError as e:
            death.declare(EngineDeadError(f"the engine's request channel failed: {e}"))
            raise (self.death if self.death.error is not None else death).fresh_error() \
                from e

    async def call(self, method: str, *args: Any, timeout: float,
                   replica: Replica | None = None) -> Any:
        """A utility call on one replica (the first by default): its result, ``TimeoutError``
        after ``timeout`` seconds, ``EngineDeadError`` if the engine dies meanwhile."""
        self.check_alive()
        self.check_loop()
        backend = self.backend
        assert backend is not None
        replica = replica if replica is not None else self.replicas[0]
        call_id = next(self._call_ids)
        fut = backend.future()
        self.calls[call_id] = replica.calls[call_id] = fut
        try:
            await self.send(UtilityCall(call_id, method, list(args)), replica)
            return await backend.wait_future(fut, timeout)
        finally:
            self.calls.pop(call_id, None)
            replica.calls.pop(call_id, None)

    def abort_soon(self, request_id: str) -> None:
        """Abort from places that cannot await (a generator's cleanup, the output task)."""
        stream = self.by_wire.get(request_id)
        self._pending_aborts.append((stream.replica if stream is not None else 0, request_id))
        if len(self._pending_aborts) == 1 and self.backend is not None and not self.closed:
            task = self.backend.spawn(self._flush_aborts, name="aioengine-aborts")
            self.background.add(task)
            task.add_done_callback(self.background.discard)

    async def _flush_aborts(self) -> None:
        assert self.backend is not None
        await self.backend.checkpoint()  # let a burst of cancellations collect into one message
        pending, self._pending_aborts = self._pending_aborts, []
        for replica in self.replicas:  # one message per live replica
            ids = [wire_id for i, wire_id in pending if i == replica.index]
            if ids and self.death.error is None and replica.death.error is None:
                try:
                    await self.send(AbortRequests(ids), replica)
                except EngineDeadError:
                    pass  # its streams are failing already
