"""The client's engine replicas: each one engine (with its own channels and TP workers), its own
send lock, message router and death, and the load the router balances on.

With ``data_parallel_size=1`` there is one replica whose death *is* the client's death, so the
single-engine path is unchanged. With more, each replica has its own ``ReplicaDeath``: it fails
that replica's streams and calls only, then tells the client, which either declares itself dead
(``replica_failure="fail"``) or keeps serving on the survivors (``"degrade"``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from aioengine.client.backend_types import Backend, CallFuture
from aioengine.client.dp.router import ReplicaLoad
from aioengine.client.engine_death import EngineDeath
from aioengine.client.engine_messages import EngineMessageRouter
from aioengine.client.launch import EngineProcess
from aioengine.client.request_stream import RequestStream
from aioengine.config import EngineConfig
from aioengine.runtime.errors import EngineDeadError


class Replica:
    __slots__ = ("calls", "death", "engine", "index", "load", "router", "send_lock")

    def __init__(self, index: int, death: EngineDeath, calls: dict[int, CallFuture],
                 by_wire: Mapping[str, RequestStream], backend: Backend) -> None:
        self.index = index
        self.death = death
        self.calls = calls  # this replica's pending utility calls (its death fails them)
        self.router = EngineMessageRouter(by_wire, calls, death)
        self.load = ReplicaLoad()
        self.send_lock = backend.lock()
        self.engine: EngineProcess | None = None


class ReplicaDeath(EngineDeath):
    """A replica's death: names the replica in the error, then calls ``on_declared``."""

    __slots__ = ("_index", "_on_declared")

    def __init__(self, index: int, streams: Mapping[str, RequestStream],
                 calls: Mapping[int, CallFuture],
                 on_declared: Callable[[int, EngineDeadError], None]) -> None:
        super().__init__(streams, calls)
        self._index = index
        self._on_declared = on_declared

    def declare(self, error: EngineDeadError) -> None:
        if self.error is not None:
            return
        named = EngineDeadError(f"replica {self._index}: {error}", process=error.process,
                                exitcode=error.exitcode)
        named.__cause__ = error
        super().declare(named)
        self._on_declared(self._index, named)


class _StreamsOf(Mapping[str, RequestStream]):
    """The open streams routed to one replica (a view: read only when it dies)."""

    def __init__(self, by_wire: Mapping[str, RequestStream], index: int) -> None:
        self._by_wire = by_wire
        self._index = index

    def __getitem__(self, key: str) -> RequestStream:
        stream = self._by_wire[key]
        if stream.replica != self._index:
            raise KeyError(key)
        return stream

    def __iter__(self) -> Iterator[str]:
        return (k for k, s in list(self._by_wire.items()) if s.replica == self._index)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def build_replicas(n: int, client_death: EngineDeath, client_calls: dict[int, CallFuture],
                   by_wire: Mapping[str, RequestStream],
                   on_replica_dead: Callable[[int, EngineDeadError], None],
                   backend: Backend) -> list[Replica]:
    """One replica (n == 1: the client's own death and calls), or n with deaths of their own,
    each bound to ``backend``. ``on_replica_dead`` must not hold the client strongly (monitor
    threads hold the deaths)."""
    if n == 1:
        client_death.bind(backend)
        return [Replica(0, client_death, client_calls, by_wire, backend)]
    replicas = []
    for i in range(n):
        calls: dict[int, CallFuture] = {}
        death = ReplicaDeath(i, _StreamsOf(by_wire, i), calls, on_replica_dead)
        death.bind(backend)
        replicas.append(Replica(i, death, calls, by_wire, backend))
    return replicas


def weak_callback(obj: Any, fn: Callable[[Any, int, EngineDeadError], None]
                  ) -> Callable[[int, EngineDeadError], None]:
    """``fn(obj, ...)`` through a weak reference to ``obj`` (a no-op once it is gone)."""
    ref = weakref.ref(obj)

    def call(index: int, error: EngineDeadError) -> None:
        target = ref()
        if target is not None:
            fn(target, index, error)
    return call


def replica_config(config: EngineConfig, index: int) -> EngineConfig:
    """The config of replica ``index``: one engine, its own channel addresses (and
    ``dist_init_addr`` port, + ``index``), and its share of the CPUs (``threads_per_replica``)."""
    n = config.data_parallel_size
    if n == 1:
        return config
    dist = config.dist_init_addr
    if dist is not None:  # each replica's ranks rendezvous on their own port
        host, _, port = dist.rpartition(":")
        dist = f"{host}:{int(port) + index}" if port.isdigit() else dist
    return config.replace(data_parallel_size=1, transport=replica_transport(config.transport,
                                                                            index),
                          num_threads=threads_per_replica(config), dist_init_addr=dist)


def threads_per_replica(config: EngineConfig) -> int:
    """``num_threads`` when set; else the usable CPUs less one (the host's) split evenly over
    every rank of every replica, at least one: two 2-thread pools on 2 cores oversubscribe,
    and an OpenMP pool that spins on a busy core runs many times slower (config.num_threads)."""
    if config.num_threads is not None:
        return config.num_threads
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    ranks = config.data_parallel_size * config.tensor_parallel_size
    return max(1, (usable - 1) // ranks)


def replica_transport(transport: str, index: int) -> str:
    """A short name gives every channel a private address already; a URL gets one per replica:
    ``tcp`` ports step by two (requests, outputs) unless 0, other URLs get ``-r<index>``."""
    if "://" not in transport or index == 0:
        return transport
    if transport.startswith("zmq+tcp://"):
        host, _, port = transport[len("zmq+tcp://"):].rpartition(":")
        if port.isdigit() and int(port) != 0:
            return f"zmq+tcp://{host}:{int(port) + 2 * index}"
        return transport
    return f"{transport}-r{index}"


def close_all_sync(engines: list[EngineProcess]) -> None:
    """For the client's ``weakref.finalize``."""
    for engine in engines:
        engine.close_sync()
