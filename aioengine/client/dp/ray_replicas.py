"""Replicas placed by Ray (``distributed_backend="ray"``): one placement group per replica (a
bundle per TP rank, ``STRICT_PACK``: the engine and its workers on one node), one
``ReplicaActor`` in it that spawns the engine there. The host binds the replica's channels: over
the configured transport when Ray placed the actor on the host's own node (decided by Ray node
id, not by IP), else over ``zmq+tcp://`` on the host's node IP (``ray_force_tcp`` takes TCP on
one node too, so tests exercise the cross-host path).

Death: the host keeps one ``wait_dead`` call pending on each actor. It returns when the engine
(or a worker) died, and it fails when the actor or its node died; either declares the replica
dead. Shutdown stops the engine through the actor, kills the actor and removes its placement
group, so nothing is left in ``ray status``.

Ray is imported only here, and only when ``distributed_backend="ray"``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aioengine.client.asyncio_backend import AsyncioBackend
from aioengine.client.dp.replicas import Replica, replica_transport
from aioengine.client.launch import (
    ENGINE_NAME,
    EngineProcess,
    EngineReady,
    channel_urls,
    close_quietly,
    stop_surely,
)
from aioengine.config import EngineConfig
from aioengine.hub import resolve_model
from aioengine.messages.launch import EngineLaunch, engine_channel_capacity
from aioengine.runtime.errors import EngineDeadError, EngineStartupError
from transports import AsyncReader, AsyncWriter, open_async_reader, open_async_writer

logger = logging.getLogger(__name__)

WAIT_DEAD_POLL = 3600.0  # seconds one pending wait_dead call may block before it is renewed
SHUTDOWN_TIMEOUT = 30.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise EngineStartupError("distributed_backend='ray' needs Ray: pip install "
                                 "'aioengine[ray]'") from e
    return ray


class RayEngineHandle:
    """Stands in for the ``Supervisor`` of a local engine: the actor and placement group."""

    def __init__(self, ray: Any, actor: Any, group: Any, pid: int, node_id: str) -> None:
        self._ray = ray
        self.actor = actor
        self.group = group
        self.node_id = node_id
        self._pid = pid
        self._closed = False
        self.watch: asyncio.Task[None] | None = None

    @property
    def names(self) -> list[str]:
        return [ENGINE_NAME]

    def pid(self, name: str) -> int:
        """The engine's pid on its node (not this host's, unless the node is this host)."""
        return self._pid

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        watch = self.watch
        if watch is not None and not watch.done():  # from any thread: on the watch's loop
            try:
                watch.get_loop().call_soon_threadsafe(watch.cancel)
            except RuntimeError:
                pass  # that loop is closed: the task went with it
        ray = self._ray
        try:
            ray.get(self.actor.shutdown.remote(), timeout=SHUTDOWN_TIMEOUT)
        except Exception as e:  # the actor or its node is gone already: nothing to stop there
            logger.debug("replica actor shutdown: %r", e)
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception as e:
            logger.debug("killing the replica actor: %r", e)
        try:
            ray.util.remove_placement_group(self.group)
        except Exception as e:
            logger.debug("removing the placement group: %r", e)


async def launch_ray_replicas(config: EngineConfig, replicas: list[Replica],
                              backend: AsyncioBackend) -> list[EngineProcess]:
    """Place and start every replica; on any failure none is left (actors, groups, channels)."""
    ray = import_ray()
    if not ray.is_initialized():  # RAY_ADDRESS names a cluster, else a local one is started
        await asyncio.to_thread(ray.init)
    try:
        resolved = await asyncio.to_thread(resolve_model, config.model, config.tokenizer,
                                           require_tokenizer=True)
    except (FileNotFoundError, ValueError) as e:
        raise EngineStartupError(f"cannot start an engine for model {config.model!r}: {e}") \
            from e
    loop = backend.loop
    results = await asyncio.gather(*(_launch_one(ray, config, r, resolved, backend)
                                     for r in replicas),
                                   return_exceptions=True)
    started = [e for e in results if isinstance(e, EngineProcess)]
    failures = [e for e in results if isinstance(e, BaseException)]
    if failures:
        await asyncio.gather(*(e.close(backend) for e in started), return_exceptions=True)
        raise failures[0]
    for replica, engine in zip(replicas, started, strict=True):
        replica.engine = engine
        handle = engine.supervisor
        assert isinstance(handle, RayEngineHandle)
        handle.watch = loop.create_task(_watch(ray, handle, replica),
                                        name=f"aioengine-ray-watch-{replica.index}")
    return started


async def _launch_one(ray: Any, config: EngineConfig, replica: Replica, resolved: Any,
                      backend: AsyncioBackend) -> EngineProcess:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from aioengine.client.dp.ray_actor import ReplicaActor

    # Each rank's threads are the CPUs its bundle reserves on the node (one by default: the
    # host's CPU count says nothing about the node's).
    threads = config.num_threads or 1
    group = ray.util.placement_group([{"CPU": threads}] * config.tensor_parallel_size,
                                     strategy="STRICT_PACK",
                                     name=f"aioengine-replica-{replica.index}-{id(replica):x}")
    requests: AsyncWriter | None = None
    outputs: AsyncReader | None = None
    actor = None
    try:
        await asyncio.wait_for(group.ready(), config.startup_timeout)
        # The actor takes the group's first bundle; its engine and workers use the group's
        # CPUs as one process tree on that node (Ray schedules the actor, our supervisor the
        # rest).
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        actor = ray.remote(ReplicaActor).options(
            num_cpus=threads, max_concurrency=4, scheduling_strategy=strategy).remote()
        node_id, node_ip = await actor.node.remote()
        host_node = ray.get_runtime_context().get_node_id()
        if node_id == host_node and not config.ray_force_tcp:
            transport = replica_transport(config.transport, replica.index)
        else:
            transport = f"zmq+tcp://{ray.util.get_node_ip_address()}:0"
        rconfig = config.replace(data_parallel_size=1, transport=transport,
                                 num_threads=threads)
        req_url, out_url = channel_urls(transport)
        requests = await open_async_writer(req_url, bind=True,
                                           capacity=engine_channel_capacity(req_url))
        outputs = await open_async_reader(out_url, bind=True)
        launch = EngineLaunch(rconfig.to_msgpack(), requests.address, outputs.address)
        try:
            payload = await actor.start.remote(launch.encode(), config.startup_timeout)
        except ray.exceptions.RayTaskError as e:
            raise EngineStartupError(f"replica {replica.index} on node {node_id[:8]} ({node_ip})"
                                     f" did not start: {e.cause!r}") from e
        handle = RayEngineHandle(ray, actor, group, int(payload.pop("pid")), node_id)
        payload.pop("actor_pid", None)
        # Duck-typed: EngineProcess and the client use only names, pid() and shutdown().
        return EngineProcess(handle, requests, outputs,
                             EngineReady.from_payload(payload), resolved)
    except BaseException:
        close_quietly(requests, outputs)
        if actor is not None:
            await stop_surely(backend, RayEngineHandle(ray, actor, group, 0, "").shutdown)
        else:
            ray.util.remove_placement_group(group)
        raise


async def _watch(ray: Any, handle: RayEngineHandle, replica: Replica) -> None:
    """Declare the replica dead when its engine dies or its actor (or node) does."""
    while True:
        try:
            died = await handle.actor.wait_dead.remote(WAIT_DEAD_POLL)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # RayActorError: the actor, its worker or its node is gone
            error = EngineDeadError(f"the replica's Ray actor died: {type(e).__name__}",
                                    process=ENGINE_NAME)
            break
        if died:
            error = EngineDeadError(died, process=ENGINE_NAME)
            break
    replica.death.from_monitor_thread(error)
