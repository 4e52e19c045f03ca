"""The host <-> engine channels on ``shm`` use small rings: they carry token ids, and every
ring is pre-faulted in both processes (resident memory of the serving tree)."""

from __future__ import annotations

from aioengine import LLM, SamplingParams
from aioengine.messages.launch import ENGINE_RING_BYTES, engine_channel_capacity
from tests.client.conftest import tiny_config


def _ring_mappings() -> dict[str, int]:
    """This process's mappings of shm rings: address range -> size."""
    rings = {}
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:aioengine-shm" in line:
                where = line.split()[0]
                start, end = where.split("-")
                rings[where] = int(end, 16) - int(start, 16)
    return rings


def test_engine_channels_get_small_rings() -> None:
    before = _ring_mappings()
    with LLM(tiny_config("shm")) as llm:
        out = llm.generate(["hello"] * 3, SamplingParams(max_tokens=4, ignore_eos=True),
                           use_tqdm=False)
        # (after a round trip: the output ring is mapped once the engine has connected)
        sizes = [size for where, size in _ring_mappings().items() if where not in before]
    assert [len(o.token_ids) for o in out] == [4, 4, 4]
    assert len(sizes) == 2  # requests and outputs
    assert all(ENGINE_RING_BYTES <= s <= ENGINE_RING_BYTES + 65536 for s in sizes), sizes


def test_capacity_only_for_shm() -> None:
    assert engine_channel_capacity("shm") == ENGINE_RING_BYTES
    assert engine_channel_capacity("shm://aioengine-x") == ENGINE_RING_BYTES
    assert engine_channel_capacity("zmq") is None
    assert engine_channel_capacity("uds://x") is None
    assert engine_channel_capacity("zmq+tcp://127.0.0.1:0") is None
