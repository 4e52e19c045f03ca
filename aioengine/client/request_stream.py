"""One open stream of the client: its request's state, the event that wakes its consumer, and
the request's id on the wire, and the replica it was sent to."""

from __future__ import annotations

from aioengine.client.backend_types import Waker
from aioengine.client.request_state import RequestState


class RequestStream:
    __slots__ = ("event", "replica", "state", "wire_id")

    def __init__(self, state: RequestState, wire_id: str, replica: int, event: Waker) -> None:
        self.state = state
        self.wire_id = wire_id
        self.replica = replica
        self.event = event  # the backend's: asyncio.Event under asyncio
