"""The writer's side of a channel: creates the ring and its eventfds, admits readers through
the rendezvous socket, and runs ``send`` as a generator of waits (see ``core``)."""

from __future__ import annotations

import logging
import os
import select
import socket
import time
from collections.abc import Generator, Sequence

from transports._deadline import check_timeout
from transports.base import Buffer
from transports.errors import AddressError, PeerClosedError, TransportError
from transports.shm import rendezvous as R
from transports.shm import segment as S
from transports.shm.core import Core, Wait, drain, earliest, expired, new_eventfd
from transports.shm.ring_writer import RingWriter

log = logging.getLogger(__name__)

# How often a writer that never has to wait still looks for a dead reader (a reader that
# closed cleanly is seen at the very next send through shared memory).
LIVENESS_INTERVAL = 0.1


class WriterCore(Core):
    def __init__(self, name: str, capacity: int, num_readers: int, connect_timeout: float,
                 bind: bool) -> None:
        super().__init__(name, connect_timeout)
        self.num_readers = num_readers
        self._listener: socket.socket | None = None
        self._pending: list[socket.socket] = []
        self._links: dict[int, socket.socket] = {}
        self._link_fds: frozenset[int] = frozenset()
        self._link_poll = select.poll()
        self._next_check = 0.0
        self._memfd: int | None = None
        self._seg: S.Segment | None = None
        try:
            if bind:
                self._listener = self.own_socket(R.listen(name, backlog=num_readers + 4))
            self._seg, self._memfd = S.Segment.create(name, capacity, num_readers)
            self._fds.append(self._memfd)
            self._reader_efds = [new_eventfd() for _ in range(num_readers)]
            self._fds.extend(self._reader_efds)
            self.space_efd = new_eventfd()
            self._fds.append(self.space_efd)
            wake = [(S.reader_sleeping_slot(r), fd) for r, fd in enumerate(self._reader_efds)]
            self.ring = RingWriter(self._seg, wake, self._fence)
            self._slots = self._seg.slots
            self._closed_slots = [S.reader_closed_slot(r) for r in range(num_readers)]
        except BaseException:
            self.close()
            raise

    @property
    def ready(self) -> bool:
        return len(self._links) == self.num_readers

    # ---- rendezvous --------------------------------------------------------------------------
    def adopt(self, sock: socket.socket) -> None:
        """We connected to a binding reader: hand it the ring right away (point-to-point)."""
        self.own_socket(sock)
        self._offer(sock, 0)
        self._ready()

    def _offer(self, sock: socket.socket, rank: int) -> None:
        assert self._seg is not None and self._memfd is not None
        R.send_frame(sock, R.OFFER, R.WRITER, rank=rank, capacity=self._seg.capacity,
                     num_readers=self.num_readers,
                     fds=[self._memfd, self._reader_efds[rank], self.space_efd])
        self._links[rank] = sock

    def progress(self) -> bool:
        """Admit whatever readers have connected (non-blocking); True once all are in."""
        assert self._listener is not None
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
            frame.close_fds()
            reason = self._refusal(frame)
            if reason:
                log.warning("%s refused a peer: %s", self.url, reason)
                self._socks.remove(sock)
                R.reject(sock, R.WRITER, reason)
                continue
            self._offer(sock, frame.rank)
        if self.ready:
            self._ready()
        return self.ready

    def _refusal(self, frame: R.Frame) -> str:
        if frame.kind != R.HELLO or frame.role != R.READER:
            return (f"{self.url} is bound by a writer and was reached by another "
                    f"{R.ROLE_NAMES.get(frame.role, 'unknown peer')}; one side must read")
        n = self.num_readers
        if frame.rank >= n:
            return f"rank {frame.rank} is out of range: {self.url} has {n} reader(s)"
        if frame.rank in self._links:
            return f"rank {frame.rank} is already connected to {self.url}"
        return ""

    def _ready(self) -> None:
        """Everyone is in: stop listening (frees the name), forget the memfd (the mappings
        keep the memory alive), and watch each reader's connection for its death."""
        if self._listener is not None:
            self.drop_socket(self._listener)
            self._listener = None
        for sock in self._pending:
            self.drop_socket(sock)
        self._pending = []
        if self._memfd is not None:
            self._fds.remove(self._memfd)
            os.close(self._memfd)
            self._memfd = None
        for sock in self._links.values():
            self._link_poll.register(sock.fileno(), select.POLLIN)
        self._link_fds = frozenset(s.fileno() for s in self._links.values())
        self.fast = not self.closed

    def _rendezvous_wait(self, deadline: float | None, timeout: float | None) -> Wait:
        end = self.rendezvous_end()
        if time.monotonic() >= end:
            missing = [r for r in range(self.num_readers) if r not in self._links]
            raise TimeoutError(
                f"only {len(self._links)} of {self.num_readers} reader(s) connected to "
                f"{self.url} within {self.connect_timeout} s (connect_timeout); missing "
                f"rank(s) {missing}")
        if expired(deadline):
            raise TimeoutError(f"send on {self.url} timed out after {timeout} s waiting for "
                               f"readers ({len(self._links)} of {self.num_readers} connected)")
        assert self._listener is not None
        fds = (self._listener.fileno(), *(s.fileno() for s in self._pending), self.close_efd)
        return Wait(fds, earliest(deadline, end))

    # ---- liveness ----------------------------------------------------------------------------
    def check_peers(self) -> None:
        """Raise if a reader closed (shared-memory flag, every call) or died (its connection,
        polled at most every LIVENESS_INTERVAL unless ``poll_links`` is called directly)."""
        slots = self._slots
        for slot in self._closed_slots:
            if slots[slot]:
                rank = self.ring.closed_reader()
                raise self.fail(PeerClosedError(f"reader {rank} of {self.url} closed its end"))
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + LIVENESS_INTERVAL
            self.poll_links()

    def poll_links(self) -> None:
        for fd, events in self._link_poll.poll(0):
            rank = next(r for r, s in self._links.items() if s.fileno() == fd)
            try:
                frame = R.recv_frame(self._links[rank])
            except PeerClosedError:
                raise self.fail(PeerClosedError(
                    f"reader {rank} of {self.url} disconnected (closed or died)")) from None
            if frame is None:
                if events & (select.POLLHUP | select.POLLERR):
                    raise self.fail(PeerClosedError(f"reader {rank} of {self.url} hung up"))
                continue
            frame.close_fds()
            if frame.kind == R.REJECT:
                raise self.fail(AddressError(f"{self.url} refused this writer: {frame.reason}"))
            raise self.fail(TransportError(f"unexpected frame kind {frame.kind} from reader "
                                           f"{rank} of {self.url}"))

    # ---- send --------------------------------------------------------------------------------
    def send_op(self, header: Buffer, buffers: Sequence[Buffer],
                timeout: float | None) -> Generator[Wait, frozenset[int], None] | None:
        """A send up to its first wait, for every driver: the fast path (one record into the
        ring), else staging and pumping. None when the message is out; else the steps that
        finish it, for the driver to run. The caller counts the operation (``ops``)."""
        if timeout is not None:
            check_timeout(timeout)
        if self.fast:
            self.check_peers()
            if self.ring.put_now(header, buffers):
                return None
        deadline = None if timeout is None else time.monotonic() + timeout
        self.check_usable()
        self.stage(header, buffers)
        if self.send_now():
            return None
        return self.send_steps(deadline, timeout)

    def stage(self, header: Buffer, buffers: Sequence[Buffer]) -> None:
        self.ring.start(header, buffers)

    def send_now(self) -> bool:
        """Finish the staged message without waiting, if possible."""
        if not self.ready:
            return False
        try:
            self.check_peers()
            return self.ring.pump()
        except BaseException:
            self.ring.abandon()
            raise

    def send_steps(self, deadline: float | None,
                   timeout: float | None) -> Generator[Wait, frozenset[int], None]:
        """Finish the staged message, yielding whenever we must wait (bind, or a full ring)."""
        ring = self.ring
        try:
            while not self.ready:
                self.check_open()
                if self.progress():
                    break
                yield self._rendezvous_wait(deadline, timeout)
            while True:
                self.check_open()
                self.check_peers()
                if ring.pump():
                    return
                if expired(deadline):
                    raise TimeoutError(
                        f"send on {self.url} timed out after {timeout} s: the ring is full "
                        f"({ring.need} bytes needed, {ring.free_bytes()} free of "
                        f"{self._seg.capacity if self._seg else 0})")
                fired = yield Wait((self.space_efd, self.close_efd, *self._link_fds), deadline,
                                   ring.has_space, ring.arm, self._disarm)
                if fired & self._link_fds:
                    self.poll_links()
        except BaseException:
            ring.abandon()
            raise

    def _disarm(self) -> None:
        self.ring.disarm()
        drain(self.space_efd)

    # ---- closing -----------------------------------------------------------------------------
    def _announce_close(self) -> None:
        if getattr(self, "ring", None) is not None:
            self.ring.mark_closed()

    def _free(self) -> None:
        if self._seg is not None:
            self._seg.close()
