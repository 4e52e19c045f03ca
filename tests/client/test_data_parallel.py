"""Data parallelism on one host: two tiny engines behind one client, over every transport.

Greedy outputs equal one engine's, load spreads, a repeated prefix stays on one replica (and
hits its prefix cache), stats show both replicas and their total. The autouse leak check in
tests/conftest.py fails any test that leaves a process, socket file or /dev/shm segment behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest

from aioengine import LLM, AsyncMPClient, EngineConfig, RequestOutput, SamplingParams
from aioengine.client.dp.replicas import (
    replica_config,
    replica_transport,
    threads_per_replica,
)
from tests.client.conftest import tiny_config
from tests.client.run_on import CASE_IDS, CLIENT_CASES, gather

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [f"request number {i} says hello to the replicas" for i in range(8)]


async def final(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    outs = [out async for out in stream]
    assert outs and outs[-1].finished
    return outs[-1]


async def run_all(client: AsyncMPClient, prompts: list[str]) -> list[list[int]]:
    async def one(p: str) -> list[int]:
        return (await final(client.generate(p, GREEDY))).token_ids

    return list(await gather(*(lambda p=p: one(p) for p in prompts)))


@pytest.fixture(scope="module")
def one_engine() -> list[list[int]]:
    """One engine's greedy tokens for PROMPTS, all in one batch: what the replicas must give on
    every case (one engine started for the module, not one a case: ~3 s each on 2 cores)."""
    with LLM(tiny_config("shm")) as llm:
        return [list(out.token_ids) for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize(("transport", "backend"), CLIENT_CASES, ids=CASE_IDS)
def test_two_replicas_match_one_engine_and_share_the_load(transport: str, backend: str,
                                                          one_engine: list[list[int]]) -> None:
    async def main() -> None:
        async with AsyncMPClient(tiny_config(transport, data_parallel_size=2)) as two:
            assert set(two.process_ids) == {"aioengine-engine-0", "aioengine-engine-1"}
            assert [list(t) for t in await run_all(two, PROMPTS)] == one_engine
            stats = await two.get_stats()
            await two.check_health()
            assert len(await two.reset_prefix_cache()) == 2
        assert stats.data_parallel_size == 2 and stats.replicas_alive == 2
        assert stats.replicas is not None and len(stats.replicas) == 2
        per = [s.num_requests_finished_total for s in stats.replicas if s is not None]
        assert sum(per) == stats.num_requests_finished_total == len(PROMPTS)
        assert min(per) >= 2, per  # both replicas served a fair share
        assert stats.kv_blocks_total == 2 * 512  # the total sums the replicas
        assert stats.kv_bytes_reserved == sum(s.kv_bytes_reserved for s in stats.replicas
                                              if s is not None) > 0
        # each process of the tree once: the host, and each replica's engine
        assert sorted(p.role for p in stats.processes) == [
            "host", "replica0/engine", "replica1/engine"]
        assert len({p.pid for p in stats.processes}) == 3

    anyio.run(main, backend=backend)


def test_a_repeated_prefix_goes_to_the_replica_that_caches_it() -> None:
    async def main() -> None:
        async with AsyncMPClient(tiny_config("shm", data_parallel_size=2)) as client:
            prefix = list(range(100, 100 + 64))  # four full blocks of 16
            params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
            cached = []
            for i in range(6):  # one at a time: without affinity the idle pair alternates
                out = await final(client.generate([*prefix, 7, i], params))
                cached.append(out.num_cached_tokens)
            # and unrelated prompts one at a time alternate between the replicas
            for i in range(4):
                async for _ in client.generate([500 + i] * 3, params):
                    pass
            stats = await client.get_stats()
        assert cached[0] == 0 and all(c == 64 for c in cached[1:]), cached
        assert stats.replicas is not None
        finished = sorted(s.num_requests_finished_total for s in stats.replicas if s)
        assert finished == [2, 8], finished  # six on the prefix's replica, 2 + 2 others

    asyncio.run(main())


def test_sync_llm_api_runs_on_replicas() -> None:
    from aioengine import LLM
    with LLM(tiny_config("shm", data_parallel_size=2)) as llm:
        outs = llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False)
        stats = llm.get_stats()
    assert [len(o.token_ids) for o in outs] == [12] * 4
    assert stats.data_parallel_size == 2 and stats.num_requests_finished_total == 4


def test_replica_settings_are_checked_and_derived() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="data_parallel_size"):
            EngineConfig(data_parallel_size=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replica_failure"):
        EngineConfig(replica_failure="retry")
    with pytest.raises(ValueError, match="distributed_backend"):
        EngineConfig(distributed_backend="k8s")
    assert threads_per_replica(EngineConfig(data_parallel_size=2, num_threads=3)) == 3
    assert threads_per_replica(EngineConfig(data_parallel_size=64)) == 1
    assert replica_transport("shm", 1) == "shm"
    assert replica_transport("zmq+tcp://127.0.0.1:5550", 1) == "zmq+tcp://127.0.0.1:5552"
    assert replica_transport("zmq+tcp://127.0.0.1:0", 1) == "zmq+tcp://127.0.0.1:0"
    assert replica_transport("uds:///tmp/x.sock", 2) == "uds:///tmp/x.sock-r2"
    two = EngineConfig(data_parallel_size=2, dist_init_addr="127.0.0.1:29500", num_threads=1)
    assert [replica_config(two, i).dist_init_addr for i in (0, 1)] == ["127.0.0.1:29500",
                                                                       "127.0.0.1:29501"]
    assert replica_config(two, 1).data_parallel_size == 1


def test_dropped_replicated_client_is_collected_and_stops_every_engine() -> None:
    import gc
    import weakref

    from tests.client.test_client_lifecycle import engine_gone, tasks_left_after

    async def run() -> tuple[bool, list[bool], list[str]]:
        client = AsyncMPClient(tiny_config("shm", data_parallel_size=2))
        await client.start()
        await run_all(client, PROMPTS[:2])
        pids = list(client.process_ids.values())
        ref = weakref.ref(client)
        del client
        gc.collect()
        collected = ref() is None
        if not collected:  # clean up for the leak check, then fail below
            await ref().shutdown()  # type: ignore[union-attr]
        gone = [engine_gone(p, 60) for p in pids]
        return collected, gone, await tasks_left_after(30.0)

    collected, gone, tasks_left = asyncio.run(run())
    assert collected, "the dropped client is still referenced"
    assert gone == [True, True], "a dropped client's engine is still running"
    assert tasks_left == []


def test_ray_is_imported_only_for_the_ray_backend() -> None:
    import subprocess
    import sys

    from tests.server.server_process import ROOT

    code = ("import sys, asyncio\n"
            "import aioengine.client.async_client, aioengine.integrations.ray_serve\n"
            "import aioengine.server, aioengine.bench.scale\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n"
            "sys.modules['ray'] = None  # as if it were not installed\n"
            "from aioengine import AsyncMPClient, EngineConfig, EngineStartupError\n"
            "async def main():\n"
            "    try:\n"
            "        await AsyncMPClient(EngineConfig(distributed_backend='ray')).start()\n"
            "    except EngineStartupError as e:\n"
            "        print(e)\n"
            "if __name__ == '__main__':\n"
            "    asyncio.run(main())\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "pip install 'aioengine[ray]'" in r.stdout, r.stdout + r.stderr
