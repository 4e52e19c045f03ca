"""Reading the Messages API's event stream off a raw response, checking framing and order
strictly against Anthropic's documented flow."""

from __future__ import annotations

import json
from typing import Any

import requests

_DELTA_OF = {"text": "text_delta", "tool_use": "input_json_delta", "thinking": "thinking_delta"}


def read_events(resp: requests.Response) -> list[dict[str, Any]]:
    """Every event's data, in order; asserts each is ``event: <type>`` then one ``data:`` line
    whose JSON ``type`` is the event's name."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    return parse_events(resp.content.decode())


def parse_events(raw: str) -> list[dict[str, Any]]:
    """``read_events`` of a stream's whole text."""
    frames = raw.split("\n\n")
    assert frames[-1] == "", repr(raw[-200:])
    out = []
    for frame in frames[:-1]:
        head, data = frame.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), repr(frame)
        event = json.loads(data[len("data: "):])
        assert event["type"] == head[len("event: "):], frame
        out.append(event)
    return out


def check_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """message_start, then content blocks (start, deltas of the block's kind, stop; indices
    0, 1, ...), then one message_delta and message_stop; pings anywhere after the start.
    Returns the blocks, reassembled (text joined; tool_use input parsed from its deltas)."""
    kinds = [e["type"] for e in events if e["type"] != "ping"]
    assert kinds[0] == "message_start" and events[0]["type"] == "message_start", kinds
    assert kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert kinds.count("message_delta") == 1 and kinds.count("message_start") == 1
    blocks: list[dict[str, Any]] = []
    parts: list[str] = []
    open_block = None
    for e in events[1:-2]:
        if e["type"] == "ping":
            continue
        if e["type"] == "content_block_start":
            assert open_block is None and e["index"] == len(blocks), e
            open_block = dict(e["content_block"])
            parts = []
        elif e["type"] == "content_block_delta":
            assert open_block is not None and e["index"] == len(blocks), e
            delta = e["delta"]
            assert delta["type"] == _DELTA_OF[open_block["type"]], (open_block, delta)
            parts.append(delta.get("text", delta.get("partial_json", "")))
        else:
            assert e["type"] == "content_block_stop" and open_block is not None, e
            assert e["index"] == len(blocks)
            if open_block["type"] == "text":
                open_block["text"] += "".join(parts)
            else:
                open_block["input"] = json.loads("".join(parts) or "{}")
            blocks.append(open_block)
            open_block = None
    assert open_block is None
    return blocks
