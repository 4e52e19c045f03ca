"""Admission control: past EngineConfig.max_queued_requests / max_queued_tokens a request is
refused at once (EngineOverloadedError; 503 with Retry-After over HTTP), admitted ones finish,
and the queue takes new work once it drains."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from aioengine import AsyncMPClient, EngineConfig, EngineOverloadedError, SamplingParams
from aioengine.server import create_app

pytestmark = pytest.mark.anyio
MAX_QUEUED = 8
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def limited(anyio_backend: str) -> AsyncIterator[AsyncMPClient]:
    config = EngineConfig(model="tiny", max_model_len=256, num_kv_blocks=256, max_num_seqs=4,
                          max_queued_requests=MAX_QUEUED, max_queued_tokens=150)
    async with AsyncMPClient(config) as client:
        yield client


async def _drain(client: AsyncMPClient, prompt: str | list[int]) -> str:
    reason = ""
    async for out in client.generate(prompt, PARAMS):
        reason = out.finish_reason or ""
    return reason


async def test_the_client_refuses_past_the_queue_limit_and_recovers(limited):
    tasks = [asyncio.ensure_future(_drain(limited, f"request {i}")) for i in range(MAX_QUEUED)]
    await asyncio.sleep(0)  # each has been admitted (nothing awaited before that)
    with pytest.raises(EngineOverloadedError, match=r"8 requests are waiting "
                                                    r"\(max_queued_requests=8\); retry later") \
            as info:
        await _drain(limited, "one too many")
    assert info.value.queued_requests == MAX_QUEUED and info.value.queued_tokens > 0
    assert await asyncio.gather(*tasks) == ["length"] * MAX_QUEUED
    assert await _drain(limited, "after the queue drained") == "length"


async def test_the_token_limit_counts_prompt_tokens(limited):
    first = asyncio.ensure_future(_drain(limited, [7] * 200))  # alone: admitted over the limit
    await asyncio.sleep(0)
    with pytest.raises(EngineOverloadedError, match=r"200 prompt tokens are waiting and this "
                                                    r"request adds 100 \(max_queued_tokens"
                                                    r"=150\)"):
        await _drain(limited, [7] * 100)
    assert await first == "length"
    assert await _drain(limited, [7] * 100) == "length"


async def test_http_overload_gets_503_with_retry_after_and_admitted_ones_finish(limited):
    srv = TestServer(create_app(limited), host="127.0.0.1")
    await srv.start_server()
    try:
        body = {"prompt": "x", "max_tokens": 8, "ignore_eos": True}
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as s:
            async def one() -> tuple[int, str | None, str]:
                async with s.post(srv.make_url("/v1/completions"), json=body) as r:
                    payload = await r.json()
                    code = payload["error"]["code"] if r.status != 200 else \
                        payload["choices"][0]["finish_reason"]
                    return r.status, r.headers.get("Retry-After"), code

            results = await asyncio.gather(*(one() for _ in range(300)))
            async with s.get(srv.make_url("/metrics")) as r:
                metrics = await r.text()
        counts = Counter(results)
        assert set(counts) == {(200, None, "length"), (503, "1", "overloaded")}, counts
        assert counts[(200, None, "length")] >= MAX_QUEUED
        refused = counts[(503, "1", "overloaded")]
        assert refused > 0
        assert (f'aioengine_requests_total{{endpoint="completions",model="tiny",'
                f'outcome="overloaded"}} {float(refused)}') in metrics
        assert await _drain(limited, "still serving") == "length"
    finally:
        await srv.close()
