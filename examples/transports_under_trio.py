"""The ``transports`` library in a trio program: a channel from a worker process (a plain
blocking writer) to an async reader on trio's event loop.

    python examples/transports_under_trio.py [COUNT] [TRANSPORT]

TRANSPORT is shm (the default), uds or zmq. ``open_async_*`` give endpoints that wait on
asyncio's loop when one runs and through anyio otherwise, so the same code runs under
``anyio.run(main, backend="asyncio")`` too.
"""

from __future__ import annotations

import multiprocessing
import sys

import anyio
import sniffio

import transports as T


def produce(address: str, count: int) -> None:
    """The worker process: connect to the reader and send ``count`` numbered messages."""
    with T.open_writer(address, bind=False, connect_timeout=30) as writer:
        for i in range(count):
            writer.send(b"message %d" % i, [bytes(1000)])  # a header and one out-of-band buffer


async def main(count: int, transport: str) -> None:
    reader = await T.open_async_reader(transport, bind=True)  # a private address; the writer
    # connects to it
    worker = multiprocessing.get_context("spawn").Process(target=produce,
                                                          args=(reader.address, count))
    worker.start()
    try:
        got = 0
        while True:
            try:
                msg = await reader.recv(timeout=30)
            except T.PeerClosedError:  # the writer closed: everything it sent has arrived
                break
            assert bytes(msg.header) == b"message %d" % got and len(msg.buffers[0]) == 1000
            got += 1
        print(f"received {got} messages in order under {sniffio.current_async_library()}")
    finally:
        reader.close()
        await anyio.to_thread.run_sync(worker.join)


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
              sys.argv[2] if len(sys.argv) > 2 else "shm", backend="trio")
