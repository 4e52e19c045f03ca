"""The zmq protocol written once, without I/O: waiting for peers, sending and receiving run as
generators that yield a ``Wait`` each time they can make no progress without blocking; the
driver (``sync``: ``zmq.Poller``; ``aio``: the loop's registered fds) waits and resumes the
generator with ``next``. What is specific to a driver stays there: its lock, its wake-up on
``close()``, the fast paths tried before a generator is made, and how it waits for zmq to be
done with a caller's buffers (the trackers a send returns).

Every non-blocking step goes through ``Channel`` (monitor events, subscriptions, the frames)."""

from __future__ import annotations

from collections.abc import Generator, Sequence

import zmq

from transports._checks import check_args, check_num_readers, check_rank
from transports._deadline import Deadline, check_timeout
from transports.base import Message
from transports.zmq import channel as C
from transports.zmq.address import parse

BACKOFF_FIRST = 0.001  # seconds; XPUB's wait for a slow reader doubles up to BACKOFF_MAX
BACKOFF_MAX = 0.02


class Wait:
    """Until ``deadline``, a socket ``event`` (0: none; the monitor socket always counts) or
    ``close()``. The driver skips the wait when ``settle`` (a socket event, 0: never) or a
    monitor event is already pending: zmq's fds are edge-triggered, so waiting then could
    sleep through the news."""

    __slots__ = ("deadline", "event", "settle")

    def __init__(self, deadline: Deadline, event: int, settle: int) -> None:
        self.deadline = deadline
        self.event = event
        self.settle = settle



class Plan:
    """What an ``open_*`` builds, the same for every driver: a socket of ``kind`` that binds or
    connects (``connect``: the opener waits for the handshake before it returns)."""

    __slots__ = ("address", "bind", "connect", "hwm", "kind", "num_readers", "rank")

    def __init__(self, kind: int, address: str | None, bind: bool, hwm: int,
                 num_readers: int | None = None, rank: int | None = None) -> None:
        self.kind, self.address, self.bind, self.hwm = kind, address, bind, hwm
        self.num_readers, self.rank = num_readers, rank
        self.connect = not bind and kind != C.XPUB


def plan_writer(address: str | None, bind: bool, capacity: int, connect_timeout: float) -> Plan:
    check_args(capacity, connect_timeout)
    return Plan(C.PUSH, address, bind, C.hwm_for(capacity))


def plan_reader(address: str | None, bind: bool, capacity: int, connect_timeout: float) -> Plan:
    check_args(capacity, connect_timeout)
    return Plan(C.PULL, address, bind, C.hwm_for(capacity))


def plan_broadcast_writer(address: str | None, num_readers: int, capacity: int,
                          connect_timeout: float) -> Plan:
    check_args(capacity, connect_timeout)
    check_num_readers(num_readers)
    return Plan(C.XPUB, address, True, C.hwm_for(capacity), num_readers=num_readers)


def plan_broadcast_reader(address: str | None, rank: int, connect_timeout: float) -> Plan:
    check_timeout(connect_timeout, "connect_timeout")
    check_rank(rank)
    return Plan(C.SUB, address, False, C.hwm_for(C.DEFAULT_READER_CAPACITY), rank=rank)


class ZmqCore:
    """One endpoint's protocol state: its ``Channel`` and the connect deadline, which starts at
    the first operation that has to wait for peers and is kept across operations."""

    __slots__ = ("ch", "connect_deadline", "connect_timeout")

    def __init__(self, ch: C.Channel, connect_timeout: float) -> None:
        self.ch = ch
        self.connect_timeout = connect_timeout
        self.connect_deadline: Deadline | None = None

    @classmethod
    def open(cls, owner: object, plan: Plan, connect_timeout: float) -> ZmqCore:
        """The channel ``plan`` describes (``owner``: the endpoint, whose collection removes an
        ipc socket file)."""
        addr = parse(plan.address, binding=plan.bind)
        ch = C.Channel(owner, plan.kind, addr, bind=plan.bind, hwm=plan.hwm,
                       num_readers=plan.num_readers, rank=plan.rank)
        return cls(ch, connect_timeout)

    def connecting(self) -> Generator[Wait, None, None]:
        """A connecting endpoint's opener waits until the handshake with the binder is done."""
        return self.ensure_ready(Deadline(self.connect_timeout), connecting=True)

    def settled(self, event: int) -> bool:
        """True when neither ``event`` on the data socket nor a monitor event is pending."""
        ch = self.ch
        return not ((event and ch.has(event)) or ch.mon_has_events())

    def ensure_ready(self, deadline: Deadline,
                     connecting: bool = False) -> Generator[Wait, None, None]:
        ch = self.ch
        ch.process_events()
        if ch.error is not None:
            raise ch.error
        if ch.ready:
            return
        if self.connect_deadline is None:
            self.connect_deadline = Deadline(self.connect_timeout)
        wait = Deadline.earliest(deadline, self.connect_deadline)
        # XPUB learns of subscribers by reading the socket; the rest from the monitor.
        step = Wait(wait, C.POLLIN if ch.kind == C.XPUB else 0, C.POLLIN)
        while True:
            ch.process_events()
            if ch.error is not None:
                raise ch.error
            if ch.ready:
                return
            if wait.expired():
                raise ready_timeout(ch, self.connect_deadline, self.connect_timeout, connecting)
            yield step

    def send(self, frames: list[memoryview],
             deadline: Deadline) -> Generator[Wait, None, list[zmq.MessageTracker]]:
        """Queue one message, waiting for peers and for room; returns the trackers of the
        caller's writable large buffers (zmq reads them later: the driver waits for them)."""
        ch = self.ch
        if not ch.ready:  # once ready, send_step's own look at the events is enough
            yield from self.ensure_ready(deadline)
        backoff = BACKOFF_FIRST
        room = Wait(deadline, C.POLLOUT, C.POLLOUT)
        while True:
            trackers = ch.send_step(frames)
            if trackers is not None:
                return trackers
            if deadline.expired():
                raise TimeoutError(f"channel {ch.url} stayed full; nothing was sent")
            if ch.kind == C.XPUB:
                # XPUB never reports POLLOUT honestly: back off until a slow reader drains.
                yield Wait(Deadline.earliest(deadline, Deadline(backoff)), 0, 0)
                backoff = min(backoff * 2, BACKOFF_MAX)
            else:
                yield room

    def recv(self, deadline: Deadline,
             timeout: float | None) -> Generator[Wait, None, Message]:
        """The next message, waiting for peers and for data; what a departed peer sent before
        leaving comes first, then PeerClosedError (``Channel.recv_step``)."""
        ch = self.ch
        if not ch.ready:
            yield from self.ensure_ready(deadline)
        data = Wait(deadline, C.POLLIN, C.POLLIN)
        while True:
            msg = ch.recv_step()
            if msg is not None:
                return msg
            if deadline.expired():
                raise TimeoutError(f"no message on {ch.url} within {timeout} s")
            yield data


def ready_timeout(ch: C.Channel, connect_deadline: Deadline, connect_timeout: float,
                  connecting: bool) -> TimeoutError:
    if connecting:
        return TimeoutError(f"could not connect to {ch.url} within {connect_timeout} s "
                            "(connect_timeout)")
    what = f"only {len(ch.ranks)} of {ch.num_readers} readers" if ch.kind == C.XPUB else "no peer"
    if connect_deadline.expired():
        return TimeoutError(f"{what} connected to {ch.url} within {connect_timeout} s "
                            "(connect_timeout)")
    return TimeoutError(f"timed out waiting for peers of {ch.url} ({what} connected so far)")


__all__: Sequence[str] = ("Plan", "Wait", "ZmqCore", "plan_broadcast_reader",
                         "plan_broadcast_writer", "plan_reader", "plan_writer", "ready_timeout")
