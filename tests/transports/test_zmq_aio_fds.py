"""zmq asyncio endpoints keep their fds registered with the loop from the first wait to close:
nothing is lost across many waits, a wake-up nobody waits for does not make the loop spin,
and neither close() nor dropping the endpoint leaves an fd registered (numbers get reused)."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

import transports as T


async def _pair() -> tuple[T.AsyncReader, T.SyncWriter]:
    r = await T.open_async_reader("zmq", bind=True)
    w = await asyncio.to_thread(T.open_writer, r.address, bind=False, connect_timeout=10)
    return r, w


def _registered(loop: asyncio.AbstractEventLoop, fds: list[int]) -> list[int]:
    """The fds still registered (remove_reader says whether it removed one)."""
    return [fd for fd in fds if loop.remove_reader(fd)]


def test_messages_after_many_waits_and_no_spin_while_nobody_waits() -> None:
    async def main() -> None:
        r, w = await _pair()
        try:
            for i in range(50):  # each recv waits: the writer sends only once it is waiting
                loop = asyncio.get_running_loop()
                loop.call_later(0.002, w.send, b"%d" % i)
                assert bytes((await r.recv(timeout=10)).header) == b"%d" % i
            with pytest.raises(TimeoutError):  # found the queue empty: the next arrival
                await r.recv(timeout=0.05)  # signals the fd
            # Nobody receives while these arrive: the loop is told once, re-arms, and idles.
            for i in range(20):
                w.send(b"late%d" % i)
            c0 = time.process_time()
            await asyncio.sleep(0.5)
            spent = time.process_time() - c0
            assert spent < 0.2, f"the loop spun on a ready fd: {spent:.3f} s CPU in 0.5 s"
            got = [bytes((await r.recv(timeout=10)).header) for _ in range(20)]
            assert got == [b"late%d" % i for i in range(20)]
        finally:
            w.close()
            r.close()

    asyncio.run(main())


def test_close_and_drop_unregister_the_fds() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        r, w = await _pair()
        fds = list(r._fds)  # type: ignore[attr-defined]
        loop.call_later(0.01, w.send, b"x")
        await r.recv(timeout=10)  # waited: registered now
        r.close()
        assert _registered(loop, fds) == []
        w.close()

        r, w = await _pair()
        fds = list(r._fds)  # type: ignore[attr-defined]
        loop.call_later(0.01, w.send, b"y")
        await r.recv(timeout=10)
        del r  # dropped without close(): the finalizer unregisters, then closes
        gc.collect()
        assert _registered(loop, fds) == []
        w.close()

    asyncio.run(main())
