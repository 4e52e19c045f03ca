"""Chat messages as clients really send them: the assistant fields OpenAI defines (``refusal``,
``tool_calls``, ``function_call``, ``audio``) are accepted when null, as OpenAI does (a history
replayed from another API carries them), and (``tool_calls`` aside: see test_tools.py) refused
with a 400 naming the field when they carry something; a field inside a message is named with
its path."""

from __future__ import annotations

import aiohttp
import pytest

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hi"}
NULLS = {"refusal": None, "tool_calls": None, "function_call": None, "audio": None}


async def _post(server, messages: list[dict]) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, \
            s.post(server.make_url("/v1/chat/completions"),
                   json={"messages": messages, "max_tokens": 2}) as resp:
        return resp.status, await resp.json()


async def test_null_assistant_fields_are_accepted(server):
    status, body = await _post(server, [USER, {"role": "assistant", "content": "hello", **NULLS},
                                        USER])
    assert status == 200, body


async def test_openai_client_replays_a_history_dumped_without_nones(server, oai):
    """The ``openai`` client's own objects, dumped as a history store would (``exclude_none``
    drops the response-only ``annotations``; the request fields stay, as null)."""
    r = await oai.chat.completions.create(model="tiny", messages=[USER], max_tokens=3)
    turn = r.choices[0].message.model_dump(exclude={"annotations"})
    assert "refusal" in turn and "tool_calls" in turn  # sent as null
    again = await oai.chat.completions.create(model="tiny", max_tokens=3,
                                              messages=[USER, turn, USER])
    assert again.choices[0].message.role == "assistant"


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("function_call", {"name": "f", "arguments": "{}"}, "not the deprecated function_call"),
    ("refusal", "I cannot", "refusal"),
    ("audio", {"id": "a"}, "audio"),
])
async def test_assistant_fields_with_a_value_are_refused_by_name(server, field, value, fragment):
    status, body = await _post(server, [USER, {"role": "assistant", "content": "x",
                                               field: value}, USER])
    err = body["error"]
    assert status == 400 and err["param"] == f"messages[1].{field}", body
    assert err["code"] == "unsupported_parameter" and fragment in err["message"], body


@pytest.mark.parametrize(("message", "param", "fragment"), [
    ({"role": "user", "content": "x", "refusal": None}, "messages[1].refusal", "`refusal`"),
    ({"role": "user", "content": "x", "mood": "happy"}, "messages[1].mood", "`mood`"),
    ({"role": "tool", "content": "42", "tool_call_id": "c"}, "messages[1].tool_call_id",
     "tool_call_id 'c' answers no tool call"),
    ({"role": "user", "content": "x", "tool_call_id": "c"}, "messages[1].tool_call_id",
     "`tool_call_id`"),
    ({"role": "user", "content": [{"type": "text"}]}, "messages[1].content[0].text",
     "missing required field `text`"),
    ({"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]},
     "messages[1].content[0].x", "`x`"),
])
async def test_a_field_inside_a_message_is_named_with_its_path(server, message, param, fragment):
    status, body = await _post(server, [USER, message])
    assert status == 400 and body["error"]["param"] == param, body
    assert fragment in body["error"]["message"], body
