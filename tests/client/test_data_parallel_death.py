"""A replica's death: SIGKILL one of two engines mid-stream. Its own streams fail with
``EngineDeadError`` within the bound; by default the whole client is dead then, and with
``replica_failure="degrade"`` the other replica's streams finish and new requests are served.
The autouse leak check (tests/conftest.py) fails a test that leaves anything behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from aioengine import AsyncMPClient, EngineDeadError, SamplingParams
from tests.client.conftest import TRANSPORTS, tiny_config
from tests.client.test_client_death import DEATH_BOUND, assert_dead_now

LONG = SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)


async def kill_one_replica(client: AsyncMPClient, params: SamplingParams, n: int = 6
                           ) -> tuple[list[BaseException | int], list[int], float]:
    """Start ``n`` streams over both replicas, SIGKILL replica 1's engine once all flow.
    Returns each stream's outcome (its error, or its token count), the replicas they went
    to, and the seconds from the kill to the last EngineDeadError."""
    flowing = [asyncio.Event() for _ in range(n)]
    failed_at: list[float] = []

    async def consume(i: int) -> int:
        tokens = 0
        try:
            async for out in client.generate(f"stream {i} keeps going", params):
                tokens = len(out.token_ids)
                flowing[i].set()
        except EngineDeadError:
            failed_at.append(time.monotonic())
            raise
        return tokens

    tasks = [asyncio.create_task(consume(i)) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in flowing)), 120)
    replica_of = [s.replica for s in client._link.by_wire.values()]
    assert sorted(replica_of) == [0] * (n // 2) + [1] * (n // 2)  # least loaded: even
    killed_at = time.monotonic()
    os.kill(client.process_ids["aioengine-engine-1"], signal.SIGKILL)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    delay = max(failed_at) - killed_at if failed_at else 0.0
    return list(results), replica_of, delay


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_dead_replica_kills_the_client_by_default(transport: str) -> None:
    async def main() -> float:
        async with AsyncMPClient(tiny_config(transport, data_parallel_size=2)) as client:
            results, _, delay = await kill_one_replica(client, LONG)
            assert all(isinstance(r, EngineDeadError) for r in results), results
            assert "replica 1" in str(client._link.death.error)
            await assert_dead_now(client)
            return delay

    assert asyncio.run(main()) < DEATH_BOUND


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_degrade_keeps_serving_on_the_survivor(transport: str) -> None:
    async def main() -> float:
        config = tiny_config(transport, data_parallel_size=2, replica_failure="degrade")
        async with AsyncMPClient(config) as client:
            results, _, delay = await kill_one_replica(client, SHORT)
            dead = [r for r in results if isinstance(r, EngineDeadError)]
            done = [r for r in results if not isinstance(r, BaseException)]
            assert len(dead) == 3 and done == [200] * 3, results
            assert all("replica 1" in str(e) for e in dead)
            assert not client.is_dead and client.replicas_alive == 1
            # new requests all go to the survivor
            for i in range(3):
                outs = [out async for out in client.generate(f"after {i}", SHORT)]
                assert len(outs[-1].token_ids) == 200
            await client.check_health()
            stats = await client.get_stats()
            assert stats.replicas_alive == 1 and stats.data_parallel_size == 2
            assert stats.replicas is not None and stats.replicas[1] is None
            assert stats.num_requests_finished_total == 6  # 3 before, 3 after, on replica 0
            return delay

    assert asyncio.run(main()) < DEATH_BOUND


def test_degrade_dies_with_its_last_replica() -> None:
    async def main() -> None:
        config = tiny_config("shm", data_parallel_size=2, replica_failure="degrade")
        async with AsyncMPClient(config) as client:
            pids = client.process_ids
            os.kill(pids["aioengine-engine-0"], signal.SIGKILL)
            async with asyncio.timeout(DEATH_BOUND):
                while client.replicas_alive != 1:
                    await asyncio.sleep(0.01)
            assert not client.is_dead
            os.kill(pids["aioengine-engine-1"], signal.SIGKILL)
            error = await asyncio.wait_for(client.wait_dead(), DEATH_BOUND)
            assert "replica 1" in str(error)
            await assert_dead_now(client)

    asyncio.run(main())
