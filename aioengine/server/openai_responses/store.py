"""The responses kept for ``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``:
in memory, bounded by a count and by bytes (``ServerSettings.response_store_max_count`` and
``response_store_max_bytes``); the least recently used go first. Each app has its own."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from aioengine.server.responses import Json


@dataclass(frozen=True)
class Stored:
    items: list[Any]
    """The conversation so far as input items: the previous ones, the request's, the output."""
    body: Json
    """The response as ``GET`` returns it."""
    size: int


class ResponseStore:
    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, response_id: str, items: list[Any], body: Json) -> bool:
        """Keep a response (evicting the least recently used past the bounds); False when it
        alone is over them, and so not kept."""
        size = len(msgspec.json.encode(items)) + len(msgspec.json.encode(body))
        if self.max_count < 1 or size > self.max_bytes:
            return False
        self.delete(response_id)
        self._entries[response_id] = Stored(items, body, size)
        self._bytes += size
        while len(self._entries) > self.max_count or self._bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.size
        return True

    def get(self, response_id: str) -> Stored | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True
