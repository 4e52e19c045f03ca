"""A start that is cancelled still stops what it started: ``stop_surely`` runs the blocking stop
in a thread of its own, so cancelling the wait for it (anyio cancels a cancelled scope's task
again at every await; a queued executor job whose wait is cancelled never runs) cannot lose it.
Without it an interrupted ``LLM(...)`` left the engine starting and the loop's close waiting for
``wait_ready`` until the start-up timeout (tests/bench/test_bench_interrupt.py on a cold
machine)."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from aioengine.client.backends import current_backend
from aioengine.client.launch import stop_surely


@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_a_cancelled_wait_still_runs_the_stop_to_its_end(library):
    ran = threading.Event()
    waited: list[bool] = []

    def stop() -> None:
        time.sleep(0.2)
        ran.set()

    async def main() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()  # every await below is cancelled, as in an interrupted start
            await stop_surely(current_backend(), stop)
            waited.append(ran.is_set())  # only a shielded wait gets here (trio's)

    anyio.run(main, backend=library)
    assert ran.wait(10), "the stop never ran"
    assert waited in ([], [True])  # a shielded wait returns after the stop, not before
