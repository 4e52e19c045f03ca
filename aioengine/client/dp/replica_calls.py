"""The client's calls that span replicas: stats, pings, pids, and what a replica's death does.

Functions of the client's ``EngineLink`` (its replicas, deaths and utility calls), to keep
``async_client`` about one engine's streams.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

from aioengine.client.dp.stats import total_stats
from aioengine.messages.engine_io import EngineStats
from aioengine.runtime.errors import EngineDeadError

if TYPE_CHECKING:
    from aioengine.client.dp.replicas import Replica
    from aioengine.client.engine_link import EngineLink

logger = logging.getLogger(__name__)


async def each_live(link: EngineLink, method: str, timeout: float) -> Any:
    """``method`` on every live replica at once: one engine's answer, or a list of them (a
    replica that died meanwhile, in ``degrade`` mode, answers ``None``). A silent one raises
    ``EngineDeadError`` (``TimeoutError`` from a ping is a dead engine)."""
    link.check_alive()
    replicas = link.live()
    assert link.backend is not None

    async def one(r: Replica) -> Any:
        try:
            return await link.call(method, timeout=timeout, replica=r)
        except TimeoutError as e:
            if method != "ping":
                raise
            who = "the engine" if len(link.replicas) == 1 else f"replica {r.index}"
            raise EngineDeadError(f"{who} did not answer a ping within {timeout} s") from e
        except EngineDeadError:
            if len(link.replicas) == 1 or link.death.error is not None:
                raise
            return None  # only that replica died (degrade): the others answer for the client

    results = await link.backend.gather(*(one(r) for r in replicas))
    return results[0] if len(link.replicas) == 1 else results


async def get_stats(link: EngineLink, timeout: float) -> EngineStats:
    if len(link.replicas) == 1:
        return msgspec.convert(await link.call("get_stats", timeout=timeout), EngineStats)
    replicas = link.live()
    answers = await each_live(link, "get_stats", timeout)
    per: list[EngineStats | None] = [None] * len(link.replicas)
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


def on_replica_dead(link: EngineLink, index: int, error: EngineDeadError) -> None:
    """``replica_failure="fail"``: the client is dead as a whole. ``"degrade"``: routing skips
    the replica from now on; the client dies only with its last replica."""
    replica = link.replicas[index] if index < len(link.replicas) else None
    if replica is None or link.death.error is not None:
        return
    replica.load.alive = False
    if link.pick is not None:
        link.pick.forget_replica(index)
    survivors = len(link.live())
    if link.config.replica_failure == "fail" or survivors == 0:
        link.death.declare(error)
        return
    logger.warning("%s; serving on %d of %d replicas (replica_failure='degrade')", error,
                   survivors, len(link.replicas))
