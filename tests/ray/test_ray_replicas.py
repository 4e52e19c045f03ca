"""Replicas placed by Ray on a two-node cluster (one CPU each), reached over zmq+tcp (forced):
both nodes serve, outputs equal the local path's, removing a node fails only its replica's
requests (degrade), and shutdown leaves no actor, placement group or engine process."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psutil
import pytest

from aioengine import AsyncMPClient, EngineConfig, EngineDeadError, SamplingParams
from tests.client.test_data_parallel_death import DEATH_BOUND

ray = pytest.importorskip("ray")

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [f"ray replica request {i}" for i in range(6)]


def ray_config(**kw: Any) -> EngineConfig:
    # startup_timeout: Ray's own processes (GCS, raylets, workers) share the two cores with
    # the engines; a loaded box took over 120 s to start one. The wait ends at READY.
    base: dict[str, Any] = {"model": "tiny", "num_kv_blocks": 256, "max_model_len": 256,
                            "data_parallel_size": 2, "distributed_backend": "ray",
                            "ray_force_tcp": True, "startup_timeout": 600.0}
    base.update(kw)
    return EngineConfig(**base)


async def greedy(client: AsyncMPClient, prompts: list[str]) -> list[list[int]]:
    async def one(p: str) -> list[int]:
        return [o async for o in client.generate(p, GREEDY)][-1].token_ids
    return list(await asyncio.gather(*(one(p) for p in prompts)))


def assert_nothing_left(pids: list[int]) -> None:
    from ray.util.state import list_actors, list_placement_groups

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        actors = [a for a in list_actors() if a.state != "DEAD"]
        groups = [g for g in list_placement_groups() if g.state != "REMOVED"]
        procs = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not (actors or groups or procs):
            return
        time.sleep(0.1)
    raise AssertionError(f"left behind: actors {actors}, placement groups {groups}, "
                         f"engine pids {procs}")


def test_both_nodes_serve_over_tcp_and_match_the_local_path(cluster: Any) -> None:
    async def main() -> None:
        async with AsyncMPClient(ray_config(distributed_backend="local",
                                            transport="zmq")) as local:
            expected = await greedy(local, PROMPTS)
        async with AsyncMPClient(ray_config()) as client:
            nodes = {r.engine.supervisor.node_id for r in client._link.replicas}
            assert len(nodes) == 2, nodes  # one replica per node
            assert all(r.engine.requests.address.startswith("zmq+tcp://")
                       for r in client._link.replicas)
            assert await greedy(client, PROMPTS) == expected
            stats = await client.get_stats()
            assert stats.replicas is not None
            assert all(s is not None and s.num_requests_finished_total >= 2
                       for s in stats.replicas)
            pids = list(client.process_ids.values())
        assert_nothing_left(pids)

    asyncio.run(main())


def test_removing_a_node_fails_only_its_requests(cluster: Any) -> None:
    async def main() -> None:
        async with AsyncMPClient(ray_config(replica_failure="degrade")) as client:
            head = ray.get_runtime_context().get_node_id()
            victim = next(r for r in client._link.replicas if r.engine.supervisor.node_id != head)
            node = next(n for n in cluster.list_all_nodes()
                        if n.node_id == victim.engine.supervisor.node_id)
            long = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True)
            flowing = [asyncio.Event() for _ in range(4)]
            failed_at: list[float] = []

            async def consume(i: int) -> int:
                tokens = 0
                try:
                    async for out in client.generate(f"node test {i}", long):
                        tokens = len(out.token_ids)
                        flowing[i].set()
                except EngineDeadError:
                    failed_at.append(time.monotonic())
                    raise
                return tokens

            tasks = [asyncio.create_task(consume(i)) for i in range(4)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in flowing)), 120)
            removed_at = time.monotonic()
            await asyncio.to_thread(cluster.remove_node, node)
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
            dead = [r for r in results if isinstance(r, EngineDeadError)]
            done = [r for r in results if not isinstance(r, BaseException)]
            assert len(dead) == 2 and done == [150, 150], results
            assert max(failed_at) - removed_at < DEATH_BOUND + 5  # node removal itself is slow
            assert client.replicas_alive == 1 and not client.is_dead
            assert (await greedy(client, PROMPTS[:2]))  # the survivor serves
            pids = list(client.process_ids.values())
        assert_nothing_left(pids)

    # Last in the package: it leaves the cluster with its head node only (adding a node back
    # here would start processes that the leak check counts as this test's).
    asyncio.run(main())
