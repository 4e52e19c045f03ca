"""A client its owner drops right after a stream ends is collected quietly on every transport:
its finalizer closes the output reader while the output task may just have been woken, and
that task must end without logging a failure."""

from __future__ import annotations

import asyncio
import gc
import logging

import psutil
import pytest

from aioengine import AsyncMPClient, SamplingParams
from tests.client.conftest import tiny_config
from tests.client.test_client_lifecycle import tasks_left_after

SHORT = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("transport", ["shm", "uds", "zmq"])
def test_dropped_client_logs_no_failure(transport: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> list[int]:
        pids: list[int] = []
        for _ in range(3):  # the gap is hit often, not always
            client = AsyncMPClient(tiny_config(transport))
            await client.start()
            async for _ in client.generate("used once", SHORT):
                pass
            pids += client.process_ids.values()
            del client
            gc.collect()
            assert await tasks_left_after(30.0) == []  # the output task ends
        return pids

    with caplog.at_level(logging.WARNING, logger="aioengine"):
        pids = asyncio.run(run())
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                 timeout=60)
    assert not alive, f"engine processes left: {alive}"
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert failures == [], failures
