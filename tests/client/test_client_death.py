"""Engine death: a SIGKILLed engine or worker fails every open stream with EngineDeadError
quickly, later calls fail at once, and nothing is left behind (the autouse leak check in
tests/conftest.py fails the test on any leftover process, socket file or /dev/shm segment)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psutil
import pytest

from aioengine import AsyncMPClient, EngineDeadError, EngineStartupError, SamplingParams
from tests.client.conftest import TRANSPORTS, tiny_config

# The contract is 1 s; the bound is generous because the test box is shared and loaded.
DEATH_BOUND = 3.0
LONG = SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True)


async def kill_mid_stream(client: AsyncMPClient, victim_pid: int, n: int = 8) -> list[float]:
    """Start ``n`` streams, SIGKILL ``victim_pid`` once all are flowing; seconds from the kill
    to each stream's EngineDeadError."""
    flowing = [asyncio.Event() for _ in range(n)]
    failed_at: list[float] = []

    async def consume(i: int) -> None:
        try:
            async for _ in client.generate(f"stream {i} keeps going", LONG):
                flowing[i].set()
        except EngineDeadError:
            failed_at.append(time.monotonic())
            raise

    tasks = [asyncio.create_task(consume(i)) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in flowing)), 120)
    killed_at = time.monotonic()
    os.kill(victim_pid, signal.SIGKILL)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    assert all(isinstance(r, EngineDeadError) for r in results), results
    return [t - killed_at for t in failed_at]


async def assert_dead_now(client: AsyncMPClient) -> None:
    assert client.is_dead
    t0 = time.monotonic()
    with pytest.raises(EngineDeadError):
        async for _ in client.generate("after death", LONG):
            pass
    with pytest.raises(EngineDeadError):
        await client.get_stats()
    with pytest.raises(EngineDeadError):
        await client.check_health()
    assert time.monotonic() - t0 < 0.5  # at once, no waiting on a dead engine


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_engine_sigkill(transport: str) -> None:
    async def main() -> list[float]:
        async with AsyncMPClient(tiny_config(transport)) as client:
            delays = await kill_mid_stream(client, client.process_ids["aioengine-engine"])
            await assert_dead_now(client)
            return delays

    delays = asyncio.run(main())
    assert len(delays) == 8 and max(delays) < DEATH_BOUND, delays


def test_worker_sigkill_with_tensor_parallelism() -> None:
    async def main() -> list[float]:
        config = tiny_config("shm", tensor_parallel_size=2, executor="mp")
        async with AsyncMPClient(config) as client:
            engine = psutil.Process(client.process_ids["aioengine-engine"])
            workers = [p for p in engine.children(recursive=True) if "tp1" in p.name()]
            assert len(workers) == 1, [p.name() for p in engine.children(recursive=True)]
            delays = await kill_mid_stream(client, workers[0].pid)
            await assert_dead_now(client)
            return delays

    delays = asyncio.run(main())
    assert len(delays) == 8 and max(delays) < DEATH_BOUND, delays


def test_missing_model_path(tmp_path) -> None:
    missing = str(tmp_path / "no-such-model")

    async def main() -> None:
        async with AsyncMPClient(tiny_config(model=missing)):
            pass

    t0 = time.monotonic()
    with pytest.raises(EngineStartupError, match="no-such-model"):
        asyncio.run(main())
    assert time.monotonic() - t0 < 10


def test_not_started_and_shut_down() -> None:
    async def main() -> None:
        client = AsyncMPClient(tiny_config())
        with pytest.raises(RuntimeError, match="not started"):
            async for _ in client.generate("x"):
                pass
        await client.shutdown()
        await client.shutdown()  # idempotent
        with pytest.raises(RuntimeError, match="shut down"):
            await client.start()

    asyncio.run(main())
