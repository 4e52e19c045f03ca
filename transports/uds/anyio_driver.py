"""uds endpoints on an event loop other than asyncio's (trio), through anyio: the same
operations as ``aio`` (``core``'s generators), only the driver's part differs:

- a wait watches its fds and a wake-up fd (``close()``) for that wait only
  (``_anyio_wait.wait_fds``); sockets close once no wait is in flight;
- a binder accepts its peers in its first operation, as the blocking driver does (trio has
  no background task without a nursery; a connector does not wait for that: its connect
  completes in the listener's backlog and its hello waits in the socket);
- a frame whose ``send`` gave up half-written is finished by a thread (``sync.ThreadFlusher``),
  which close() lets finish for ``stream.LINGER`` seconds, as the blocking writer does.

``open_async.open_async_*`` build these when no asyncio loop runs."""

from __future__ import annotations

import anyio

from transports._anyio_wait import AnyioClose, Waiting, wait_fds
from transports._deadline import Deadline
from transports._wakeup import Wakeup
from transports.errors import ChannelClosedError
from transports.uds import core as K
from transports.uds import stream as S
from transports.uds.aio import UdsAsyncReader, UdsAsyncWriter, _AsyncBase
from transports.uds.peers import Peer
from transports.uds.sync import FlushOnClose, ThreadFlusher

FLUSH_POLL_MAX = 0.01  # seconds between looks at a background flush the next send waits for


class _AnyioDriver(AnyioClose, _AsyncBase):
    def _attach(self) -> None:
        self._lock = anyio.Lock()
        self._wake = Wakeup()
        self._waiting = Waiting()

    def _accept_in_background(self) -> None:
        pass  # the first operation accepts (``_ensure_peers``)

    async def _ensure_peers(self, deadline: Deadline) -> None:
        if self._core.accepting:
            await self._run(self._core.ensure_peers(deadline))

    async def _wait(self, w: K.Wait) -> None:
        waiting = self._waiting
        waiting.ops += 1
        try:
            if w.writable:
                await wait_fds([self._wake.fd], w.deadline, w.fds)
            else:
                await wait_fds([*w.fds, self._wake.fd], w.deadline)
        finally:
            waiting.leave()
        if self._closed:
            raise ChannelClosedError(f"endpoint {self.address} was closed")

    def _release(self) -> None:
        self._core.close_sockets()


class UdsAnyioWriter(FlushOnClose, _AnyioDriver, UdsAsyncWriter):
    """A uds writer for trio (and any anyio backend)."""

    def _attach(self) -> None:
        super()._attach()
        self._thread_flusher = ThreadFlusher(self._core, self._wake, self._is_closed)

    def _is_closed(self) -> bool:
        return self._closed

    def _start_flusher(self, pending: S.Pending) -> None:
        self._thread_flusher.start(pending)

    async def _join_flusher(self, deadline: Deadline) -> None:
        pause = 0.0005
        while not self._thread_flusher.done():
            if deadline.expired():
                raise S.full_error(self.address)
            await anyio.sleep(pause)
            if self._closed:
                raise ChannelClosedError(f"endpoint {self.address} was closed")
            pause = min(pause * 2, FLUSH_POLL_MAX)



class UdsAnyioReader(_AnyioDriver, UdsAsyncReader):
    """A uds reader for trio (and any anyio backend)."""

    async def _wait_data(self, peer: Peer, deadline: Deadline) -> None:
        await self._wait(K.Wait([peer.sock.fileno()], False, deadline))


ANYIO_CLASSES: dict[type[_AsyncBase], type[_AsyncBase]] = {
    UdsAsyncWriter: UdsAnyioWriter, UdsAsyncReader: UdsAnyioReader}
