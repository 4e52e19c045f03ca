"""Reading the Responses API's event stream off a raw response, checking its framing, its
``sequence_number``s and the order of OpenAI's documented flow."""

from __future__ import annotations

import json
from typing import Any

import requests

from tests.server.anthropic_sse import parse_events

FINAL = ("response.completed", "response.incomplete", "response.failed")


def read_events(resp: requests.Response) -> list[dict[str, Any]]:
    """Every event's data, in order (keep-alive comments dropped); asserts the framing and
    that the sequence numbers count 0, 1, 2, ..."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    text = resp.content.decode()
    frames = [f for f in text.split("\n\n") if not f.startswith(": keep-alive")]
    events = parse_events("\n\n".join(frames))
    assert [e["sequence_number"] for e in events] == list(range(len(events))), events
    return events


def check_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """created, in_progress, then output items (added; a message's part added, text deltas,
    text done, part done; a call's argument deltas and done; item done; output indices 0, 1,
    ...), then one final event. Returns the items as reassembled from the deltas; asserts each
    equals its ``output_item.done`` and the final response's output."""
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in FINAL and all(k not in FINAL for k in kinds[:-1]), kinds
    assert events[0]["response"]["status"] == "in_progress"
    items: list[dict[str, Any]] = []
    i = 2
    while i < len(events) - 1:
        added = events[i]
        assert added["type"] == "response.output_item.added", kinds[i:]
        assert added["output_index"] == len(items)
        item = added["item"]
        where = {"item_id": item["id"], "output_index": len(items)}
        i += 1
        if item["type"] == "message":
            assert events[i]["type"] == "response.content_part.added"
            text = ""
            i += 1
            while events[i]["type"] == "response.output_text.delta":
                assert {k: events[i][k] for k in where} == where
                text += events[i]["delta"]
                i += 1
            assert events[i]["type"] == "response.output_text.done" and events[i]["text"] == text
            assert events[i + 1]["type"] == "response.content_part.done"
            assert events[i + 1]["part"]["text"] == text
            i += 2
            rebuilt = dict(item, content=[{"type": "output_text", "text": text,
                                           "annotations": [], "logprobs": []}])
        else:
            assert item["type"] == "function_call" and item["arguments"] == ""
            args = ""
            while events[i]["type"] == "response.function_call_arguments.delta":
                assert {k: events[i][k] for k in where} == where
                args += events[i]["delta"]
                i += 1
            assert events[i]["type"] == "response.function_call_arguments.done"
            assert events[i]["arguments"] == args and events[i]["name"] == item["name"]
            i += 1
            rebuilt = dict(item, arguments=args)
        done = events[i]
        assert done["type"] == "response.output_item.done", kinds[i:]
        assert done["item"] == dict(rebuilt, status="completed"), (done, rebuilt)
        items.append(done["item"])
        i += 1
    final = events[-1]["response"]
    assert final["output"] == items and final["id"] == events[0]["response"]["id"]
    if events[-1]["type"] != "response.failed":
        assert final["usage"]["output_tokens"] > 0
    json.dumps(final)
    return items
