"""Sizes in human units (``aioengine.units``) and the config fields that take them."""

from __future__ import annotations

import pytest

from aioengine.config import EngineConfig
from aioengine.units import format_bytes, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("4GiB", 4 * 2**30), ("4 gib", 4 * 2**30), ("512MiB", 512 * 2**20), ("8GB", 8 * 10**9),
    ("1.5GB", 1_500_000_000), ("64KiB", 65536), ("4g", 4 * 2**30), ("1000", 1000),
    ("100B", 100), (123, 123)])
def test_parse_size(text, expected) -> None:
    assert parse_size(text, "x") == expected


@pytest.mark.parametrize("bad", ["4XB", "-1GiB", "GiB", "", "0", 0, -5, 1.5, True, "4 GiBs"])
def test_bad_sizes_name_the_field(bad) -> None:
    with pytest.raises(ValueError, match=r"^kv_cache_memory must be"):
        EngineConfig(kv_cache_memory=bad)


def test_config_takes_units_and_tokens() -> None:
    assert EngineConfig(kv_cache_memory="4GiB").kv_cache_memory == 4 * 2**30
    assert EngineConfig(kv_cache_tokens=65536).kv_cache_tokens == 65536
    with pytest.raises(ValueError, match="kv_cache_tokens must be a positive integer"):
        EngineConfig(kv_cache_tokens=-1)
    with pytest.raises(ValueError, match="kv_cache_memory and kv_cache_tokens both size"):
        EngineConfig(kv_cache_memory="1GiB", kv_cache_tokens=1024)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="kv_cache_memory_fraction must be in"):
            EngineConfig(kv_cache_memory_fraction=bad)
    round_trip = EngineConfig.from_msgpack(EngineConfig(kv_cache_memory="2MiB").to_msgpack())
    assert round_trip.kv_cache_memory == 2 * 2**20


def test_format_bytes() -> None:
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
    assert format_bytes(2048) == "2.00 KiB"
    assert format_bytes(12) == "12 B"
