"""zmq endpoints on an event loop other than asyncio's (trio), through anyio: the same
operations as ``aio`` (``core``'s generators, the fast paths before them), only the waiting
differs. A wait watches the data socket's and the monitor's zmq fds and a wake-up fd
(``close()``) for that wait only (``_anyio_wait.wait_fds``). zmq's fds are edge-triggered:
the core's ``Wait.settle`` check before each wait reads ``ZMQ_EVENTS``, which re-arms them, so
a wait never sleeps through news that came before it (as in the asyncio driver).

``open_async.open_async_*`` pick these classes when no asyncio loop runs."""

from __future__ import annotations

import weakref

import anyio

from transports._anyio_wait import AnyioClose, Waiting, wait_fds
from transports._deadline import Deadline
from transports._wakeup import Wakeup
from transports.errors import ChannelClosedError
from transports.zmq import channel as C
from transports.zmq.aio import ZmqAsyncReader, ZmqAsyncWriter, _AsyncBase


class _AnyioDriver(AnyioClose, _AsyncBase):
    def _attach(self, ch: C.Channel) -> None:
        self._lock = anyio.Lock()
        self._wake = Wakeup()
        self._waiting = Waiting()
        self._watch = [*self._fds, self._wake.fd]
        weakref.finalize(self, ch.close, 0)  # dropped without close(): nothing is registered

    async def _wait(self, deadline: Deadline) -> None:
        waiting = self._waiting
        waiting.ops += 1
        try:
            await wait_fds(self._watch, deadline)
        finally:
            waiting.leave()
        if self._closed:
            raise ChannelClosedError(f"endpoint {self.address} was closed")

    async def _sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        if self._closed:
            raise ChannelClosedError(f"endpoint {self.address} was closed")

    def _release(self) -> None:
        ch = self._ch
        ch.close(ch.closing_linger(self._writer), background=True)


class ZmqAnyioWriter(_AnyioDriver, ZmqAsyncWriter):
    """A zmq writer for trio (and any anyio backend)."""


class ZmqAnyioReader(_AnyioDriver, ZmqAsyncReader):
    """A zmq reader for trio (and any anyio backend)."""


ANYIO_CLASSES: dict[type[_AsyncBase], type[_AsyncBase]] = {
    ZmqAsyncWriter: ZmqAnyioWriter, ZmqAsyncReader: ZmqAnyioReader}
