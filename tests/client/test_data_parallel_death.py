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
GUARD = 60.0  # a hang guard, not a figure: the death is seen within ~1 s (bench), the box is loaded


async def kill_one_replica(client: AsyncMPClient, n: int = 6
                           ) -> tuple[list[BaseException | int], list[int], float]:
    """Start ``n`` LONG streams over both replicas, SIGKILL replica 1's engine once all flow
    (2,000 tokens each: still running then, whatever the load). Returns each stream's outcome
    (its error, or its token count when it ended otherwise), the replica each went to (read at
    its first output), and the seconds from the kill to the last EngineDeadError."""
    flowing = [asyncio.Event() for _ in range(n)]
    replica_of = [-1] * n
    failed_at: list[float] = []

    async def consume(i: int) -> int:
        tokens = 0
        try:
            async for out in client.generate(f"stream {i} keeps going", LONG,
                                             request_id=f"s{i}"):
                tokens = len(out.token_ids)
                if not flowing[i].is_set():
                    replica_of[i] = client._link.streams[f"s{i}"].replica
                    flowing[i].set()
        except EngineDeadError:
            failed_at.append(time.monotonic())
            raise
        return tokens

    tasks = [asyncio.create_task(consume(i)) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in flowing)), 120)
    assert sorted(replica_of) == [0] * (n // 2) + [1] * (n // 2)  # least loaded: even
    killed_at = time.monotonic()
    os.kill(client.process_ids["aioengine-engine-1"], signal.SIGKILL)
    # Replica 1's streams end with the death; replica 0's keep running until aborted here.
    on_one = [t for t, r in zip(tasks, replica_of, strict=True) if r == 1]
    await asyncio.wait_for(asyncio.wait(on_one), GUARD)
    for t, r, i in zip(tasks, replica_of, range(n), strict=True):
        if r == 0 and not t.done() and not client.is_dead:  # dead: they fail on their own
            await client.abort(f"s{i}")
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), GUARD)
    delay = max(failed_at) - killed_at if failed_at else 0.0
    return list(results), replica_of, delay


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_dead_replica_kills_the_client_by_default(transport: str) -> None:
    async def main() -> float:
        async with AsyncMPClient(tiny_config(transport, data_parallel_size=2)) as client:
            results, _, delay = await kill_one_replica(client)
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
            results, replica_of, delay = await kill_one_replica(client)
            dead = [r for r, i in zip(results, replica_of, strict=True) if i == 1]
            alive = [r for r, i in zip(results, replica_of, strict=True) if i == 0]
            assert all(isinstance(r, EngineDeadError) and "replica 1" in str(r)
                       for r in dead), results
            # still running when replica 1 died, then aborted by kill_one_replica
            assert all(isinstance(r, int) and r < LONG.max_tokens for r in alive), results
            assert not client.is_dead and client.replicas_alive == 1
            # new requests all go to the survivor
            for i in range(3):
                outs = [out async for out in client.generate(f"after {i}", SHORT)]
                assert len(outs[-1].token_ids) == 200
            await client.check_health()
            stats = await client.get_stats()
            assert stats.replicas_alive == 1 and stats.data_parallel_size == 2
            assert stats.replicas is not None and stats.replicas[1] is None
            assert stats.num_requests_finished_total == 6  # 3 aborted, 3 after, on replica 0
            return delay

    assert asyncio.run(main()) < DEATH_BOUND


def test_degrade_dies_with_its_last_replica() -> None:
    async def main() -> None:
        config = tiny_config("shm", data_parallel_size=2, replica_failure="degrade")
        async with AsyncMPClient(config) as client:
            pids = client.process_ids
            os.kill(pids["aioengine-engine-0"], signal.SIGKILL)
            async with asyncio.timeout(GUARD):
                while client.replicas_alive != 1:
                    await asyncio.sleep(0.01)
            assert not client.is_dead
            os.kill(pids["aioengine-engine-1"], signal.SIGKILL)
            error = await asyncio.wait_for(client.wait_dead(), GUARD)
            assert "replica 1" in str(error)
            await assert_dead_now(client)

    asyncio.run(main())
