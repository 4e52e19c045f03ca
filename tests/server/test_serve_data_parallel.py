"""``python -m aioengine.serve --data-parallel-size 2``: both replicas serve; with
``--replica-failure degrade`` a killed replica turns ``/health`` to 200 "degraded" and the server
keeps answering on the survivor; SIGTERM then leaves nothing behind."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_process import ServerProcess

pytestmark = pytest.mark.anyio


async def _complete(s: aiohttp.ClientSession, url: str, i: int) -> int:
    body = {"prompt": f"replica test {i}", "max_tokens": 4, "ignore_eos": True}
    async with s.post(url + "/v1/completions", json=body) as resp:
        return resp.status


async def _replica_series(s: aiohttp.ClientSession, url: str) -> tuple[dict, list[str]]:
    """``aioengine_replica_up`` by replica, and the ``engine`` labels of vLLM's waiting gauge."""
    async with s.get(url + "/metrics") as resp:
        families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    up = {x.labels["replica"]: x.value for x in families["aioengine_replica_up"].samples}
    engines = sorted(x.labels["engine"] for x in families["vllm:num_requests_waiting"].samples)
    return up, engines


async def test_degraded_server_keeps_serving_and_says_so() -> None:
    with ServerProcess("--data-parallel-size", "2", "--replica-failure", "degrade") as srv:
        engines = [p for p in srv.descendants if p.name() == "aioengine-engine"]
        assert len(engines) == 2, [p.name() for p in srv.descendants]
        async with aiohttp.ClientSession() as s:
            async with s.get(srv.url + "/health") as resp:
                assert resp.status == 200 and (await resp.json()) == {"status": "ok"}
            assert await asyncio.gather(*(_complete(s, srv.url, i) for i in range(4))) \
                == [200] * 4
            assert await _replica_series(s, srv.url) == ({"0": 1.0, "1": 1.0}, ["0", "1"])
            engines[1].kill()
            psutil.wait_procs([engines[1]], timeout=10)
            # A wait for the state (the server's watcher sees the death, then /health says
            # so); 60 s is a hang guard only, not an expectation.
            deadline = time.monotonic() + 60
            while True:
                async with s.get(srv.url + "/health") as resp:
                    assert resp.status == 200
                    health = await resp.json()
                if health["status"] != "ok" or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert health == {"status": "degraded", "replicas_alive": 1,
                              "data_parallel_size": 2}
            up, series = await _replica_series(s, srv.url)
            assert sorted(up.values()) == [0.0, 1.0], up  # per replica, as routers read them
            assert series == [i for i, v in up.items() if v == 1.0]
            assert await asyncio.gather(*(_complete(s, srv.url, i) for i in range(4))) \
                == [200] * 4
        assert await asyncio.to_thread(srv.terminate) == 0, srv.output()
