"""The reader's side of a channel: gets the ring from the writer through the rendezvous
socket, maps it, and runs ``recv`` as a generator of waits (see ``core``)."""

from __future__ import annotations

import logging
import os
import select
import socket
from collections.abc import Generator

from transports.base import Message
from transports.errors import AddressError, PeerClosedError, TransportError
from transports.shm import rendezvous as R
from transports.shm import segment as S
from transports.shm.core import Core, Wait, drain, earliest, expired
from transports.shm.ring_reader import RingReader

log = logging.getLogger(__name__)


class ReaderCore(Core):
    def __init__(self, name: str, rank: int, connect_timeout: float, bind: bool) -> None:
        super().__init__(name, connect_timeout)
        self.rank = rank
        self.ring: RingReader | None = None
        self._seg: S.Segment | None = None
        self._listener: socket.socket | None = None
        self._pending: list[socket.socket] = []
        self._link: socket.socket | None = None
        self._link_fd = -1
        self._efd = -1
        self._poller: select.poll | None = None
        self._writer_gone = False
        if bind:
            try:
                self._listener = self.own_socket(R.listen(name, backlog=4))
            except BaseException:
                self.close()
                raise

    # ---- rendezvous --------------------------------------------------------------------------
    def adopt(self, sock: socket.socket) -> None:
        """We connected to a binding writer: say who we are; its OFFER comes at its first
        send, and we pick it up at our first recv."""
        self._link = self.own_socket(sock)
        R.send_frame(sock, R.HELLO, R.READER, rank=self.rank)

    def progress(self) -> bool:
        """Take the writer's OFFER if it has arrived (non-blocking); True once mapped."""
        if self._listener is not None:
            for sock in R.accept(self._listener, self.name):
                self._pending.append(self.own_socket(sock))
            for sock in list(self._pending):
                try:
                    frame = R.recv_frame(sock)
                except TransportError as e:
                    log.debug("dropped a connection to %s during set-up: %s", self.url, e)
                    self._pending.remove(sock)
                    self.drop_socket(sock)
                    continue
                if frame is None:
                    continue
                self._pending.remove(sock)
                if frame.kind == R.OFFER and frame.role == R.WRITER:
                    self._attach(frame, sock)
                    return True
                frame.close_fds()
                reason = (f"{self.url} is bound by a reader and was reached by a "
                          f"{R.ROLE_NAMES.get(frame.role, 'unknown peer')}; one side must write")
                log.warning("%s refused a peer: %s", self.url, reason)
                self._socks.remove(sock)
                R.reject(sock, R.READER, reason)
            return False
        assert self._link is not None
        try:
            frame = R.recv_frame(self._link)
        except PeerClosedError:
            raise self.fail(PeerClosedError(
                f"the writer of {self.url} went away before handing over the ring")) from None
        if frame is None:
            return False
        if frame.kind == R.OFFER and frame.role == R.WRITER:
            self._attach(frame, self._link)
            return True
        frame.close_fds()
        if frame.kind == R.REJECT:
            raise self.fail(AddressError(f"{self.url} refused reader rank {self.rank}: "
                                         f"{frame.reason}"))
        raise self.fail(TransportError(f"unexpected frame kind {frame.kind} from {self.url}"))

    def _attach(self, frame: R.Frame, sock: socket.socket) -> None:
        fds = frame.fds
        if len(fds) != 3 or frame.rank != self.rank:
            frame.close_fds()
            raise self.fail(TransportError(
                f"{self.url}: bad OFFER ({len(fds)} fds, rank {frame.rank} for reader "
                f"rank {self.rank})"))
        memfd, efd, space_efd = fds
        try:
            self._seg = S.Segment.attach(memfd, frame.capacity, frame.num_readers)
        except BaseException:
            frame.close_fds()
            raise
        os.close(memfd)  # the mapping keeps the memory; nothing else needs the fd
        self._fds += [efd, space_efd]
        self._efd = efd
        self.ring = RingReader(self._seg, self.rank, space_efd, self._fence)
        self._link, self._link_fd = sock, sock.fileno()
        self._poller = select.poll()  # for doze(): data, the writer's death, our close()
        for fd in (efd, self._link_fd, self.close_efd):
            self._poller.register(fd, select.POLLIN)
        if self._listener is not None:
            self.drop_socket(self._listener)
            self._listener = None
        for other in self._pending:
            self.drop_socket(other)
        self._pending = []
        self.fast = not self.closed

    def _rendezvous_wait(self, deadline: float | None, timeout: float | None) -> Wait:
        if self._listener is not None:
            end = self.rendezvous_end()
            if expired(end):
                raise TimeoutError(f"no writer connected to {self.url} within "
                                   f"{self.connect_timeout} s (connect_timeout)")
            fds = (self._listener.fileno(), *(s.fileno() for s in self._pending))
        else:
            end = None
            assert self._link is not None
            fds = (self._link.fileno(),)
        if expired(deadline):
            raise TimeoutError(f"recv on {self.url} timed out after {timeout} s (the writer "
                               "has not set up the channel yet)")
        return Wait((*fds, self.close_efd), earliest(deadline, end))

    # ---- liveness ----------------------------------------------------------------------------
    def _link_dead(self) -> bool:
        assert self._link is not None
        p = select.poll()
        p.register(self._link_fd, select.POLLIN)
        if not p.poll(0):
            return False
        try:
            frame = R.recv_frame(self._link)
        except PeerClosedError:
            return True
        if frame is not None:
            frame.close_fds()
            raise self.fail(TransportError(f"unexpected frame kind {frame.kind} from the "
                                           f"writer of {self.url}"))
        return False

    def _gone(self, ring: RingReader) -> Message:
        """The writer is gone: hand out what it left in the ring, then fail for good."""
        msg = ring.poll()
        if msg is not None:
            return msg
        ring.drop_partial()
        how = "closed" if ring.writer_closed() else "disconnected (exited or was killed)"
        raise self.fail(PeerClosedError(f"the writer of {self.url} {how}"))

    # ---- recv --------------------------------------------------------------------------------
    def recv_now(self) -> Message | None:
        """The next message if one is already in the ring."""
        ring = self.ring
        return None if ring is None else ring.next_message()

    def recv_steps(self, deadline: float | None,
                   timeout: float | None) -> Generator[Wait, frozenset[int], Message]:
        while self.ring is None:
            self.check_open()
            if self.progress():
                break
            yield self._rendezvous_wait(deadline, timeout)
        ring = self.ring
        assert ring is not None
        ring.release()
        while True:
            self.check_open()
            msg = ring.poll()
            if msg is not None:
                return msg
            if self._writer_gone or ring.writer_closed():
                return self._gone(ring)
            if expired(deadline):
                raise TimeoutError(f"no message arrived on {self.url} within {timeout} s")
            fired = yield Wait((self._efd, self._link_fd, self.close_efd), deadline,
                               ring.has_data, ring.arm, self._disarm)
            if self._link_fd in fired and self._link_dead():
                self._writer_gone = True

    def doze(self, ms: int) -> bool:
        """One sleep for data on the blocking fast path (ring attached, nothing pending), with
        no generator or ``Wait`` in the way. True: there is news in the ring (the writer's
        eventfd alone woke us, or data came while arming); False: a timeout, a close or the
        writer's connection stirred -- the general ``recv_steps`` path sorts out which."""
        ring = self.ring
        assert ring is not None
        if not ring.arm():
            return True
        try:
            events = self._poller.poll(ms)  # type: ignore[union-attr]  # set with the ring
        finally:
            ring.disarm()
        if len(events) == 1 and events[0][0] == self._efd:
            drain(self._efd)
            return True
        return False

    def _disarm(self) -> None:
        assert self.ring is not None
        self.ring.disarm()
        drain(self._efd)

    # ---- closing -----------------------------------------------------------------------------
    def _announce_close(self) -> None:
        if self.ring is not None:
            self.ring.mark_closed()

    def _free(self) -> None:
        if self._seg is not None:
            self._seg.close()
