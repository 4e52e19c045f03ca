"""The uds asyncio reader, what the kept registrations of every transport (test_aio_kept_fds.py)
do not cover: a wake-up that read half a frame into the reader's buffer, then a cancelled recv:
the rest completes the frame, nothing is lost."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

import transports as T
from tests.transports.kept_fds import (
    async_pair,
    recv_after_waiting,
    run,
)


async def _pair() -> tuple[T.AsyncReader, T.SyncWriter]:
    return await async_pair("uds")


def test_cancelled_recv_with_half_a_frame_read_loses_nothing() -> None:
    async def main() -> None:
        r, w = await _pair()
        try:
            await recv_after_waiting(r, w, b"first")
            # Half a frame read by the wake-up, then cancelled: the rest completes it.
            whole = b"".join(_frame(b"in two halves"))
            task = asyncio.ensure_future(r.recv())
            await asyncio.sleep(0)
            raw = socket.socket(fileno=w._peers[0].sock.fileno())  # type: ignore[attr-defined]
            try:
                raw.send(whole[:7])
                time.sleep(0.05)
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                raw.send(whole[7:])
            finally:
                raw.detach()
            assert bytes((await r.recv(timeout=10)).header) == b"in two halves"
            await recv_after_waiting(r, w, b"and the next")
        finally:
            w.close()
            r.close()

    run(main())


def _frame(header: bytes) -> list[memoryview]:
    from transports.uds.framing import frame_parts
    return frame_parts(memoryview(header), [])


