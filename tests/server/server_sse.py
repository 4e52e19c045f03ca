"""Reading Server-Sent Events off a raw aiohttp response, checking the framing strictly."""

from __future__ import annotations

import json
from typing import Any

import aiohttp


async def read_events(resp: aiohttp.ClientResponse) -> list[str]:
    """Every event's data, in order; asserts each event is exactly one ``data: `` line
    followed by a blank line, and that the stream ends right after ``data: [DONE]``."""
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    raw = (await resp.read()).decode()
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = raw.split("\n\n")
    assert events[-1] == ""
    data = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event, repr(event)
        data.append(event[len("data: "):])
    assert data.count("[DONE]") == 1
    return data


def chunks(data: list[str]) -> list[dict[str, Any]]:
    return [json.loads(d) for d in data if d != "[DONE]"]
