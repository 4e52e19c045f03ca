"""The engine the in-process server tests run on."""

from __future__ import annotations

from aioengine import EngineConfig

MAX_MODEL_LEN = 512
# For the tests whose abort, disconnect or shutdown must land while a request still decodes:
# tiny's whole context, so the request can run for thousands of steps (~6 s when idle, far
# longer on a loaded box) instead of the few hundred the shared engine's context allows
# (480 tokens took 0.9 s on a loaded 2-core box: a stall of the test process could outlast it).
LONG_MAX_MODEL_LEN = 2048
LONG_TOKENS = 2000  # ignore_eos: only an abort ends such a request before this


def engine_config() -> EngineConfig:
    # Small and fixed: the KV cache fits 200 short concurrent streams, the context is short
    # enough that a "too long" prompt is cheap to build.
    return EngineConfig(model="tiny", device="cpu", max_model_len=MAX_MODEL_LEN,
                        num_kv_blocks=1024, max_num_seqs=256)


def long_engine_config() -> EngineConfig:
    return EngineConfig(model="tiny", device="cpu", max_model_len=LONG_MAX_MODEL_LEN,
                        num_kv_blocks=1024, max_num_seqs=256)
