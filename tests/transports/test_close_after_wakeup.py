"""close() in the gap between a waiting async recv being woken and it running again: the recv
ends with ChannelClosedError (or the message that woke it), never with the closed socket's own
error. The client's finalizer closes its output reader in exactly this gap when a dropped
client is collected right after a stream ended."""

from __future__ import annotations

import asyncio
import time

import pytest

import transports as T
from tests.transports.conftest import run


@pytest.mark.parametrize("transport", T.transport_names())
def test_close_between_wakeup_and_resume_is_a_clean_close(transport: str) -> None:
    async def body() -> None:
        w = await T.open_async_writer(transport)
        r = await T.open_async_reader(w.address)
        try:
            waiting = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0.1)  # the recv is waiting on the loop
            await w.send(b"wake")
            time.sleep(0.1)  # the message has arrived: the next loop pass reports it
            # This pass: we resume first, then the transport's wake-up resolves the recv's
            # wait and schedules it; the next pass runs us before it.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            r.close()
            try:
                msg = await asyncio.wait_for(waiting, 30)  # a hang guard (loaded box)
            except T.ChannelClosedError:
                return
            assert bytes(msg.header) == b"wake"
        finally:
            w.close()
            r.close()

    run(body())
