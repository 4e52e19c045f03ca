"""The non-blocking steps of a uds endpoint, shared by the sync and async flavours: read what
a connection has into its frame reader, write one pass over the connections a frame is still
going out on, and the errors these map to. The endpoints differ only in how they wait between
steps (poll(2) with a wake-up fd, or the event loop)."""

from __future__ import annotations

import errno

from transports._deadline import Deadline
from transports.base import Message
from transports.errors import AddressError, PeerClosedError, TransportError
from transports.uds import address as A
from transports.uds.outbound import Outbound
from transports.uds.peers import AcceptSpec, Peer

# close() lets an accepted, half-written message finish for this long (to a live reader: a dead
# one ends it at once). Generous for the same reason as zmq's linger: a process's last frames
# must get through a machine so loaded that the flush waits seconds for a CPU.
LINGER = 10.0
GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN)

Pending = list[tuple[Peer, Outbound]]
DONE, STASH, WAIT = range(3)  # what a writer does after a write step


def read_step(peer: Peer, address: str) -> Message | None:
    """The next whole frame from ``peer``, reading what its socket holds now; None when it
    would block. Raises MalformedStreamError, or PeerClosedError at end of stream."""
    while True:
        msg = peer.reader.next_message()
        if msg is not None:
            return msg
        if peer.eof:
            mid = " in the middle of a message" if peer.reader.has_partial() else ""
            raise PeerClosedError(f"the peer of {address} closed the connection{mid}")
        try:
            n = peer.sock.recv_into(peer.reader.read_target())
        except BlockingIOError:
            return None
        except OSError as e:
            if e.errno not in GONE:
                raise
            n = 0
        if n == 0:
            peer.eof = True
        else:
            peer.reader.commit(n)


def write_step(outs: Pending, pending: Pending, deadline: Deadline, address: str,
               connected: bool, stash: bool) -> tuple[Pending, int]:
    """One write pass over ``pending`` (the rest of ``outs``), then the move: DONE; STASH when
    time is up with part of the frame on the wire (it must complete, or the stream breaks: the
    caller finishes it in the background from a copy); else WAIT for writability. Time up
    with nothing sent is a TimeoutError."""
    return write_move(outs, write_pass(pending, address, connected), deadline, address, stash)


def write_move(outs: Pending, pending: Pending, deadline: Deadline, address: str,
               stash: bool) -> tuple[Pending, int]:
    """What a writer does after a write pass left ``pending`` (see ``write_step``)."""
    if not pending:
        return pending, DONE
    if deadline.expired():
        if not any(out.started for _, out in outs):
            raise full_error(address)
        if stash:
            return pending, STASH
    return pending, WAIT


def write_pass(pending: Pending, address: str, connected: bool) -> Pending:
    """Write what each socket takes now; returns the connections the frame is not done on.
    A gone peer is a PeerClosedError; on a ``connected`` (not binding) writer it carries the
    binder's refusal reason when the binder refused us (then closed)."""
    still = []
    for peer, out in pending:
        try:
            done = out.send_some(peer.sock)
        except BlockingIOError:
            done = False
        except OSError as e:
            if e.errno not in GONE:
                raise
            raise peer_gone(peer, e, address, connected) from e
        if not done:
            still.append((peer, out))
    return still


def peer_gone(peer: Peer, cause: OSError, address: str, connected: bool) -> PeerClosedError:
    reason = _refusal(peer, address) if connected else None
    who = f"reader rank {peer.rank}" if peer.rank >= 0 else "reader"
    if reason is not None:
        return PeerClosedError(f"the {who} of {address} refused the connection: {reason}")
    return PeerClosedError(f"the {who} of {address} is gone ({cause.strerror or cause})")


def _refusal(peer: Peer, address: str) -> str | None:
    """The binder's reason, if its reply (already in our receive buffer) is a refusal."""
    try:
        msg = read_step(peer, address)
    except TransportError:
        return None
    return None if msg is None else A.refusal(bytes(msg.header))


def full_error(address: str) -> TimeoutError:
    return TimeoutError(f"channel {address} stayed full; nothing was sent")


def check_greeting(msg: Message, address: str) -> None:
    """A connecting reader's first frame is the binder's reply: AddressError if it refused."""
    reason = A.refusal(bytes(msg.header))
    if reason is not None:
        raise AddressError(f"{address} refused this reader: {reason}")


def accept_timeout(spec: AcceptSpec, address: str, connected: int, connect_expired: bool,
                   connect_timeout: float) -> TimeoutError:
    role = A.ROLE_NAMES[spec.role]
    if connect_expired:
        return TimeoutError(f"only {connected} of {spec.count} {role}(s) connected to {address} "
                            f"within {connect_timeout} s (connect_timeout)")
    return TimeoutError(f"timed out waiting for {role}(s) to connect to {address} "
                        f"({connected} of {spec.count} so far)")
