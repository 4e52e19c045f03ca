"""``ClientSlot``: the client an app serves, swappable while it runs (``python -m
aioengine.serve --on-engine-death restart`` puts a fresh engine's client in it).

The app's handlers read every client attribute through the slot at the time of use, so a swap
takes effect for the next request; streams already running keep the client they started on
(a dead engine's end with ``engine_dead``). While ``restarting`` is set, ``/health`` answers
503 ``engine_restarting``."""

from __future__ import annotations

from typing import Any


class ClientSlot:
    """Holds the client ``create_app`` serves; every other attribute is the current
    client's."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.restarting = False
        """True between an engine's death and its successor's start."""
        self.restarts = 0
        """Clients swapped in so far."""

    @property
    def current(self) -> Any:
        """The client served now."""
        return self._client

    def swap(self, client: Any) -> None:
        """Serve ``client`` from now on (its engine is up)."""
        self._client = client
        self.restarting = False
        self.restarts += 1

    def __getattr__(self, name: str) -> Any:  # everything else: the current client's
        return getattr(self._client, name)
