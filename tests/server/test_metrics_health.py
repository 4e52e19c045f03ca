"""``/metrics`` in Prometheus text format (per-app registry) and ``/health``."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from aioengine.server import create_app

pytestmark = pytest.mark.anyio


async def _scrape(server) -> dict[str, object]:
    async with aiohttp.ClientSession() as s, s.get(server.make_url("/metrics")) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return {f.name: f for f in text_string_to_metric_families(await resp.text())}


def _value(family, sample_name: str, **labels: str) -> float:
    return sum(s.value for s in family.samples if s.name == sample_name
               and all(s.labels.get(k) == v for k, v in labels.items()))


async def test_metrics_count_outcomes_and_latencies(server):
    before = await _scrape(server)
    async with aiohttp.ClientSession() as s:
        body = {"prompt": "metrics", "max_tokens": 5, "ignore_eos": True}
        async with s.post(server.make_url("/v1/completions"), json=body) as resp:
            assert resp.status == 200
        async with s.post(server.make_url("/v1/completions"), json={"prompt": 5}) as resp:
            assert resp.status == 400
    after = await _scrape(server)

    def delta(family: str, sample: str, **labels: str) -> float:
        old = _value(before[family], sample, **labels) if family in before else 0.0
        return _value(after[family], sample, **labels) - old

    assert delta("aioengine_requests", "aioengine_requests_total", endpoint="completions",
                 outcome="length") == 1
    assert delta("aioengine_requests", "aioengine_requests_total", endpoint="completions",
                 outcome="rejected") == 1
    assert delta("aioengine_time_to_first_token_seconds",
                 "aioengine_time_to_first_token_seconds_count") == 1
    # 5 tokens: 4 gaps, unless steps merged some (then fewer, never more). A gap is counted
    # per arrival of new tokens at the client, and on a loaded box all 5 can arrive in one
    # frame (the engine merges what its output thread has not sent yet): then 0 gaps.
    itl_count = delta("aioengine_inter_token_latency_seconds",
                      "aioengine_inter_token_latency_seconds_count")
    assert 0 <= itl_count <= 4, itl_count
    # ... and the gaps lie within the request: their sum is at most its end-to-end time.
    itl_sum = delta("aioengine_inter_token_latency_seconds",
                    "aioengine_inter_token_latency_seconds_sum")
    e2e_sum = delta("aioengine_e2e_request_latency_seconds",
                    "aioengine_e2e_request_latency_seconds_sum")
    assert 0 <= itl_sum <= e2e_sum, (itl_sum, e2e_sum)
    assert after["aioengine_engine_up"].samples[0].value == 1.0
    for gauge in ("aioengine_num_requests_running", "aioengine_num_requests_waiting",
                  "aioengine_kv_cache_usage_ratio", "aioengine_prefix_cache_hit_rate"):
        assert after[gauge].type == "gauge"
        assert after[gauge].samples[0].value >= 0.0
    assert after["aioengine_kv_cache_usage_ratio"].samples[0].value <= 1.0
    # KV bytes (issue 40): 1,024 blocks of 32 or 64 KiB (float16 or float32 cache)
    reserved = after["aioengine_kv_cache_bytes_reserved"].samples[0].value
    assert reserved / after["aioengine_kv_cache_blocks_total"].samples[0].value in (2**15, 2**16)
    for gauge in ("aioengine_kv_cache_bytes_used", "aioengine_kv_cache_bytes_prefix_cached"):
        assert after[gauge].type == "gauge"
        assert 0 <= after[gauge].samples[0].value <= reserved
    rss = {s.labels["process"]: s.value
           for s in after["aioengine_process_resident_memory_bytes"].samples}
    assert set(rss) == {"host", "engine"}, rss  # uniproc: no worker processes
    assert rss["engine"] >= reserved and rss["host"] > 0
    assert delta("aioengine_generation_tokens", "aioengine_generation_tokens_total") >= 5


async def test_two_apps_in_one_process_keep_separate_registries(server, engine):
    other = TestServer(create_app(engine), host="127.0.0.1")  # would collide on a global one
    await other.start_server()
    try:
        mine_before = _value((await _scrape(server))["aioengine_requests"],
                             "aioengine_requests_total")
        async with aiohttp.ClientSession() as s, s.post(other.make_url("/v1/completions"),
                          json={"prompt": "two", "max_tokens": 2}) as resp:
            assert resp.status == 200
        theirs = await _scrape(other)
        assert _value(theirs["aioengine_requests"], "aioengine_requests_total") == 1
        assert _value((await _scrape(server))["aioengine_requests"],
                      "aioengine_requests_total") == mine_before
    finally:
        await other.close()


async def test_health_ok_while_engine_lives(server):
    async with aiohttp.ClientSession() as s, s.get(server.make_url("/health")) as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ok"}
