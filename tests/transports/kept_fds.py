"""Shared by the tests of the asyncio endpoints that keep their fds registered (shm, uds): a real
selector loop that counts registrations, a writer/reader pair, and a recv that is waiting on the
loop when its message is sent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import transports as T

R = TypeVar("R")


class CountingLoop(asyncio.SelectorEventLoop):
    """A real selector loop that counts fd registrations (each one an epoll_ctl)."""

    def __init__(self) -> None:
        super().__init__()
        self.adds = self.removes = 0

    def add_reader(self, fd: Any, callback: Callable[..., object], *args: Any) -> None:
        self.adds += 1
        super().add_reader(fd, callback, *args)

    def remove_reader(self, fd: Any) -> bool:
        self.removes += 1
        return super().remove_reader(fd)


def run(coro: Coroutine[Any, Any, R]) -> R:
    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        return runner.run(asyncio.wait_for(coro, 60))


def counting_loop() -> CountingLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, CountingLoop)
    return loop


async def async_pair(transport: str) -> tuple[T.AsyncReader, T.SyncWriter]:
    r = await T.open_async_reader(transport, bind=True)
    w = await asyncio.to_thread(T.open_writer, r.address, bind=False, connect_timeout=10)
    return r, w


async def recv_after_waiting(r: T.AsyncReader, w: T.SyncWriter, payload: bytes,
                             buffers: tuple[bytes, ...] = ()) -> None:
    """A recv that is waiting on the loop when the message is sent."""
    task = asyncio.ensure_future(r.recv(timeout=10))
    await asyncio.sleep(0)  # runs the recv until it waits
    assert not task.done()
    if buffers:  # too big to go out at once: the writer's thread, the reader woken many times
        await asyncio.to_thread(w.send, payload, list(buffers))
    else:
        w.send(payload)
    msg = await task
    assert bytes(msg.header) == payload
    assert [bytes(b) for b in msg.buffers] == list(buffers)


def registered(loop: asyncio.AbstractEventLoop, fds: frozenset[int]) -> list[int]:
    """The fds still registered (remove_reader says whether it removed one)."""
    return [fd for fd in fds if loop.remove_reader(fd)]


def cpu_while_idle(seconds: float) -> Coroutine[Any, Any, float]:
    async def idle() -> float:
        c0 = time.process_time()
        await asyncio.sleep(seconds)
        return time.process_time() - c0
    return idle()
