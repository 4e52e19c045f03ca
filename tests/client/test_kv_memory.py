"""The KV cache on CPU sized by need, resident from the start, and shown (issue 40): real
engine processes on the tiny model."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psutil
import pytest

from aioengine import EngineConfig, EngineStartupError, SamplingParams, SyncMPClient

SEQS, LEN = 128, 2048  # tiny's whole context
PER_BLOCK = 2 * 4 * 16 * 4 * 32 * 2  # k and v x 4 layers x 16 tokens x 4 kv heads x 32 x fp16


def config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"model": "tiny", "device": "cpu", "transport": "shm",
                               "kv_cache_dtype": "float16", "max_num_seqs": SEQS,
                               "max_model_len": LEN}
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def client() -> Iterator[SyncMPClient]:
    """One engine sized by need: 128 x 2048 tokens + 10% = 18,023 blocks, 563 MiB."""
    c = SyncMPClient(config())
    try:
        yield c
    finally:
        c.shutdown()


def test_default_cpu_pool_is_the_need_plus_the_prefix_share(client) -> None:
    need = SEQS * (LEN // 16)
    blocks = need + -(-need // 10)
    stats = client.get_stats()
    assert stats.kv_blocks_total == blocks == 18023
    assert stats.kv_bytes_reserved == blocks * PER_BLOCK
    info = client.async_client.engine_info
    assert info.kv_bytes_per_block == PER_BLOCK
    assert info.kv_sized_by == ("need: max_num_seqs=128 x 2048 tokens + 10% prefix-cache share")


def test_the_pool_is_resident_after_start(client) -> None:
    stats = client.get_stats()
    engine = next(p for p in stats.processes if p.role == "engine")
    # written at start: the engine's RSS holds the whole pool (563 MiB, well above what the
    # tiny model and torch take, ~300 MiB), before any request touched a block
    assert psutil.Process(engine.pid).memory_info().rss >= stats.kv_bytes_reserved
    assert engine.rss_bytes >= stats.kv_bytes_reserved
    host = next(p for p in stats.processes if p.role == "host")
    assert host.pid == psutil.Process().pid and host.rss_bytes > 0


def test_bytes_in_use_and_held_by_the_prefix_cache(client) -> None:
    before = client.get_stats()
    prompt = list(range(3, 3 + 40))  # two full blocks the prefix cache keeps
    out = client.generate_all([(prompt, SamplingParams(max_tokens=4, ignore_eos=True))])
    assert len(out[0].token_ids) == 4
    after = client.get_stats()
    assert after.kv_bytes_used == after.kv_blocks_used * PER_BLOCK == 0  # nothing running
    assert after.kv_bytes_prefix_cached >= before.kv_bytes_prefix_cached + 2 * PER_BLOCK


@pytest.mark.parametrize(("kw", "line"), [
    ({"kv_cache_tokens": 4000}, "KV cache of 250 blocks = 4000 tokens (max_model_len 256), "
                                "7.81 MiB in float16; sized by kv_cache_tokens=4000"),
    ({"kv_cache_memory": "8MiB"}, "KV cache of 256 blocks = 4096 tokens (max_model_len 256), "
                                  "8.00 MiB in float16; sized by kv_cache_memory=8.00 MiB")])
def test_tokens_and_memory_give_the_block_count_and_say_so(kw, line, caplog) -> None:
    blocks = int(line.split()[3])
    with caplog.at_level(logging.INFO, logger="aioengine.client.launch"), \
            SyncMPClient(config(max_model_len=256, **kw)) as c:
        stats = c.get_stats()
        assert stats.kv_blocks_total == blocks
        assert stats.kv_bytes_reserved == blocks * PER_BLOCK
    assert f"engine ready: {line}" in caplog.text


def test_more_than_the_ram_fails_at_start_naming_the_setting() -> None:
    too_much = 2 * psutil.virtual_memory().total
    with pytest.raises(EngineStartupError, match="RAM available; lower kv_cache_memory"):
        SyncMPClient(config(kv_cache_memory=too_much))


def test_worker_processes_hold_the_pool_and_are_shown() -> None:
    """With the mp executor the cache lives in the worker: its RSS holds the pool at start."""
    with SyncMPClient(config(executor="mp", max_model_len=256,
                             kv_cache_memory="512MiB")) as c:
        stats = c.get_stats()
        assert stats.kv_bytes_reserved == 2**29 // PER_BLOCK * PER_BLOCK
        rss = {p.role: p.rss_bytes for p in stats.processes}
        assert set(rss) == {"host", "engine", "aioengine-worker-tp0"}, rss
        assert rss["aioengine-worker-tp0"] >= stats.kv_bytes_reserved > rss["engine"]
