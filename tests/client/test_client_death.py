"""Engine death: a SIGKILLed engine or worker fails every open stream with EngineDeadError
quickly, later calls fail at once, and nothing is left behind (the autouse leak check in
tests/conftest.py fails the test on any leftover process, socket file or /dev/shm segment).
On asyncio and under trio (``anyio.run``)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import anyio
import psutil
import pytest

from aioengine import AsyncMPClient, EngineDeadError, EngineStartupError, SamplingParams
from aioengine.client.backends import check_transport
from tests.client.conftest import tiny_config
from tests.client.run_on import BACKENDS, CASE_IDS, CLIENT_CASES

# The contract is ~1 s and the bench measures it; here the bound only tells "seen by the
# watchers" from "waited out a timeout" (the RPC and start-up timeouts are 30 s and more), so it
# is generous: on a box with both cores hogged a reap can wait seconds for a CPU.
DEATH_BOUND = 20.0
LONG = SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True)


async def kill_mid_stream(client: AsyncMPClient, victim_pid: int, n: int = 8) -> list[float]:
    """Start ``n`` streams, SIGKILL ``victim_pid`` once all are flowing; seconds from the kill
    to each stream's EngineDeadError."""
    flowing = [anyio.Event() for _ in range(n)]
    failed_at: list[float] = []
    results: list[object] = [None] * n

    async def consume(i: int) -> None:
        try:
            async for _ in client.generate(f"stream {i} keeps going", LONG):
                flowing[i].set()
        except EngineDeadError as e:
            failed_at.append(time.monotonic())
            results[i] = e

    with anyio.fail_after(150):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(consume, i)
            for e in flowing:
                await e.wait()
            killed_at = time.monotonic()
            os.kill(victim_pid, signal.SIGKILL)
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
    # at once: a call that waited on the dead engine would take its 10-30 s timeout
    assert time.monotonic() - t0 < 5.0


@pytest.mark.parametrize(("transport", "backend"), CLIENT_CASES, ids=CASE_IDS)
def test_engine_sigkill(transport: str, backend: str) -> None:
    async def main() -> list[float]:
        async with AsyncMPClient(tiny_config(transport)) as client:
            assert client.backend == backend
            delays = await kill_mid_stream(client, client.process_ids["aioengine-engine"])
            await assert_dead_now(client)
            return delays

    delays = anyio.run(main, backend=backend)
    assert len(delays) == 8 and max(delays) < DEATH_BOUND, delays


def test_engine_sigkill_under_uvloop() -> None:
    async def main() -> list[float]:
        async with AsyncMPClient(tiny_config("shm")) as client:
            assert client.backend == "asyncio"  # uvloop is an asyncio loop: asyncio's objects
            assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
            delays = await kill_mid_stream(client, client.process_ids["aioengine-engine"])
            await assert_dead_now(client)
            return delays

    delays = anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
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

    delays = anyio.run(main)
    assert len(delays) == 8 and max(delays) < DEATH_BOUND, delays


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_model_path(tmp_path, backend: str) -> None:
    missing = str(tmp_path / "no-such-model")

    async def main() -> None:
        async with AsyncMPClient(tiny_config(model=missing)):
            pass

    t0 = time.monotonic()
    with pytest.raises(EngineStartupError, match="no-such-model"):
        anyio.run(main, backend=backend)
    # well under the 120 s start-up timeout, which a missed failure would wait out (the engine
    # imports torch before it looks at the path: seconds on a loaded box)
    assert time.monotonic() - t0 < 90


@pytest.mark.parametrize("backend", BACKENDS)
def test_not_started_and_shut_down(backend: str) -> None:
    async def main() -> None:
        client = AsyncMPClient(tiny_config())
        with pytest.raises(RuntimeError, match="not started"):
            async for _ in client.generate("x"):
                pass
        await client.shutdown()
        await client.shutdown()  # idempotent
        with pytest.raises(RuntimeError, match="shut down"):
            await client.start()

    anyio.run(main, backend=backend)


def test_a_transport_without_a_driver_for_the_loop_is_named() -> None:
    """A transport whose async endpoints cannot run on the caller's loop is refused by name before
    anything starts (not with "no running event loop" from deep inside a driver)."""
    for transport in ("shm", "zmq", "uds:///tmp/aioengine-x"):
        check_transport(transport, "asyncio")
        check_transport(transport, "trio")
        with pytest.raises(ValueError, match=f"transport {transport!r} has no curio driver"):
            check_transport(transport, "curio")
