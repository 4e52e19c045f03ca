"""The client's calls that span replicas: stats, pings, pids, and what a replica's death does.

Functions of the client rather than its methods, to keep ``async_client`` about one engine's
streams; they use the client's private parts on purpose.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import msgspec

from aioengine.client.dp.stats import total_stats
from aioengine.messages.engine_io import AbortRequests, EngineStats
from aioengine.runtime.errors import EngineDeadError

if TYPE_CHECKING:
    from aioengine.client.async_client import AsyncMPClient
    from aioengine.client.dp.replicas import Replica

logger = logging.getLogger(__name__)


def live(client: AsyncMPClient) -> list[Replica]:
    return [r for r in client._replicas if r.load.alive and r.death.error is None]


async def each_live(client: AsyncMPClient, method: str, timeout: float) -> Any:
    """``method`` on every live replica at once: one engine's answer, or a list of them (a
    replica that died meanwhile, in ``degrade`` mode, answers ``None``). A silent one raises
    ``EngineDeadError`` (``TimeoutError`` from a ping is a dead engine)."""
    client._check_alive()
    replicas = live(client)

    async def one(r: Replica) -> Any:
        try:
            return await client._call(method, timeout=timeout, replica=r)
        except TimeoutError as e:
            if method != "ping":
                raise
            who = "the engine" if len(client._replicas) == 1 else f"replica {r.index}"
            raise EngineDeadError(f"{who} did not answer a ping within {timeout} s") from e
        except EngineDeadError:
            if len(client._replicas) == 1 or client._death.error is not None:
                raise
            return None  # only that replica died (degrade): the others answer for the client

    results = await asyncio.gather(*(one(r) for r in replicas))
    return results[0] if len(client._replicas) == 1 else results


async def get_stats(client: AsyncMPClient, timeout: float) -> EngineStats:
    if len(client._replicas) == 1:
        return msgspec.convert(await client._call("get_stats", timeout=timeout), EngineStats)
    replicas = live(client)
    answers = await each_live(client, "get_stats", timeout)
    per: list[EngineStats | None] = [None] * len(client._replicas)
    for r, answer in zip(replicas, answers, strict=True):
        if answer is not None:
            per[r.index] = msgspec.convert(answer, EngineStats)
    return total_stats(per)


def process_ids(replicas: list[Replica]) -> dict[str, int]:
    pids: dict[str, int] = {}
    for r in replicas:
        assert r.engine is not None
        sup = r.engine.supervisor
        suffix = "" if len(replicas) == 1 else f"-{r.index}"
        pids.update({name + suffix: sup.pid(name) for name in sup.names})
    return pids


async def send_aborts(client: AsyncMPClient, pending: list[tuple[int, str]]) -> None:
    """Abort ``(replica, wire id)`` pairs, one message per live replica."""
    for replica in client._replicas:
        ids = [wire_id for i, wire_id in pending if i == replica.index]
        if ids and client._death.error is None and replica.death.error is None:
            try:
                await client._send(AbortRequests(ids), replica)
            except EngineDeadError:
                pass  # its streams are failing already


def on_replica_dead(client: AsyncMPClient, index: int, error: EngineDeadError) -> None:
    """``replica_failure="fail"``: the client is dead as a whole. ``"degrade"``: routing skips
    the replica from now on; the client dies only with its last replica."""
    replica = client._replicas[index] if index < len(client._replicas) else None
    if replica is None or client._death.error is not None:
        return
    replica.load.alive = False
    if client._pick is not None:
        client._pick.forget_replica(index)
    survivors = len(live(client))
    if client.config.replica_failure == "fail" or survivors == 0:
        client._death.declare(error)
        return
    logger.warning("%s; serving on %d of %d replicas (replica_failure='degrade')", error,
                   survivors, len(client._replicas))
