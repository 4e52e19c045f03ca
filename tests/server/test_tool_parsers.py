"""The tool-call parsers (no engine): whole replies, every way of cutting them into stream
pieces, and the calls a chat template writes for a past assistant turn read back again."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioengine.client.chat_template import ChatTemplate
from aioengine.hub.tokenizer_build import CHAT_TEMPLATE as TINY_TEMPLATE
from aioengine.server import ServerSettings
from aioengine.server.__main__ import build_parser
from aioengine.server.protocol import ChatMessage, FunctionCall, MessageToolCall
from aioengine.server.tool_parsers import CallDelta, Parsed, ParsedCall, get_parser, parser_names
from aioengine.server.tool_prompts import chat_inputs

WEATHER = ParsedCall("get_weather", '{"city": "Paris", "days": 2}')
ADD = ParsedCall("add", '{"a": 1, "b": 2}')


def streamed(parser_name: str, pieces: list[str]) -> Parsed:
    stream = get_parser(parser_name).stream()
    out = Parsed()
    for piece in pieces:
        out.add(stream.feed(piece))
    out.add(stream.finish())
    return out


def cuts(text: str, points: list[int]) -> list[str]:
    points = sorted({p % (len(text) + 1) for p in points})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


HERMES_REPLIES = [
    # (reply, content, calls)
    ("Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
     "\"days\": 2}}\n</tool_call>", "Sure.\n", [WEATHER]),
    ("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}"
     "\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n"
     "</tool_call>", "", [WEATHER, ADD]),
    # arguments given as JSON text, and "parameters" instead of "arguments"
    ("<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}"
     "</tool_call>", "", [ADD]),
    ("<tool_call>{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}</tool_call>", "",
     [ADD]),
    # cut off before the closing tag (a stop string or max_tokens) but whole JSON: a call
    ("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n", "", [ADD]),
    # the function named, the tag closed, the JSON around the arguments off (a small model's
    # missing last brace): the call as written
    ("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}\n</tool_call>",
     "", [ADD]),
    ("<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1,</tool_call>", "",
     [ParsedCall("add", '{"a": 1,')]),
    # not JSON, or not a call: shown as text, tags and all
    ("<tool_call>not json</tool_call> ok", "<tool_call>not json</tool_call> ok", None),
    ("<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
     None),
    ("<tool_call>{\"name\": \"add\"", "<tool_call>{\"name\": \"add\"", None),
    ("a < b and <tool_ is not a tag", "a < b and <tool_ is not a tag", None),
    ("plain text", "plain text", None),
]


@pytest.mark.parametrize(("reply", "content", "calls"), HERMES_REPLIES)
def test_hermes_whole_reply(reply: str, content: str, calls: list[ParsedCall] | None) -> None:
    out = get_parser("hermes").extract(reply)
    assert (out.content, out.calls) == (content, calls)
    assert get_parser("qwen").extract(reply) == out


@settings(deadline=None)  # a busy shared machine; the first example imports
@given(st.sampled_from(HERMES_REPLIES), st.lists(st.integers(0, 500), max_size=12))
def test_hermes_stream_equals_whole(case: tuple, points: list[int]) -> None:
    """However the reply is cut into pieces, streaming finds the same calls, and the content
    it lets out is the same text (whitespace aside)."""
    reply, content, calls = case
    out = streamed("hermes", cuts(reply, points))
    assert out.calls == calls
    assert out.content.strip() == content.strip()


def test_hermes_stream_holds_back_only_a_possible_tag() -> None:
    stream = get_parser("hermes").stream()
    assert stream.feed("Let me check <tool").content == "Let me check "
    assert stream.feed("box> now").content == "<toolbox> now"
    assert stream.feed(" <tool_call>{\"name\": \"add\", ").content == " "
    out = stream.feed("\"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>")
    assert (out.content, out.calls) == ("", [ADD])


LLAMA_REPLIES = [
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', "", [WEATHER]),
    ('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', "", [ADD]),
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
     '{"name": "add", "arguments": {"a": 1, "b": 2}}', "", [WEATHER, ADD]),
    ('{"city": "Paris"}', '{"city": "Paris"}', None),  # JSON, but not a call
    ('{"name": "add", "parameters": {"a": 1', '{"name": "add", "parameters": {"a": 1', None),
    ("The answer is {\"name\": 1}", "The answer is {\"name\": 1}", None),
    ("<|python", "<|python", None),
]


@pytest.mark.parametrize(("reply", "content", "calls"), LLAMA_REPLIES)
def test_llama3_json_whole_reply(reply: str, content: str, calls: list | None) -> None:
    out = get_parser("llama3_json").extract(reply)
    assert (out.content, out.calls) == (content, calls)


@settings(deadline=None)  # a busy shared machine; the first example imports
@given(st.sampled_from(LLAMA_REPLIES), st.lists(st.integers(0, 500), max_size=12))
def test_llama3_json_stream_equals_whole(case: tuple, points: list[int]) -> None:
    reply, content, calls = case
    out = streamed("llama3_json", cuts(reply, points))
    assert (out.content, out.calls) == (content, calls)


def test_llama3_json_text_streams_from_its_first_character() -> None:
    stream = get_parser("llama3_json").stream()
    assert stream.feed("  Hel").content == "  Hel"
    assert stream.feed("lo {\"name\"").content == "lo {\"name\""


def test_registry_and_settings_name_the_known_parsers() -> None:
    assert {"hermes", "qwen", "llama3_json"} <= set(parser_names())
    with pytest.raises(ValueError, match="tool_call_parser 'mistral' is not known; choose one "
                                         "of hermes, llama3_json, qwen"):
        get_parser("mistral")
    with pytest.raises(ValueError, match="is not known"):
        ServerSettings(tool_call_parser="mistral")
    assert build_parser().parse_args(["--tool-call-parser", "llama3_json"]).tool_call_parser \
        == "llama3_json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--tool-call-parser", "mistral"])


# -- what templates write for a past call, read back by the parser ---------------------------

HISTORY = [
    ChatMessage(role="user", content="Weather in Paris, and 1 + 2?"),
    ChatMessage(role="assistant", content=None, tool_calls=[
        MessageToolCall(id="call_1", function=FunctionCall("get_weather", WEATHER.arguments)),
        MessageToolCall(id="call_2", function=FunctionCall("add", ADD.arguments))]),
    ChatMessage(role="tool", content="sunny, 21 C", tool_call_id="call_1"),
    ChatMessage(role="tool", content="3", tool_call_id="call_2"),
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]

# A tool-aware template in Hugging Face's conventions (``tools``, ``message.tool_calls`` with
# arguments as dicts, ``tool`` messages), writing calls in the Llama 3 JSON format.
LLAMA_STYLE_TEMPLATE = (
    "{% if tools %}<|start|>system\nTools: {% for t in tools %}{{ t | tojson }}{% endfor %}"
    "<|end|>\n{% endif %}"
    "{% for m in messages %}<|start|>{{ 'ipython' if m.role == 'tool' else m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{% if not loop.first %}; {% endif %}"
    "{{ {'name': c.function.name, 'parameters': c.function.arguments} | tojson }}{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")


class _Tok:
    def __init__(self, source: str) -> None:
        self.chat_template = ChatTemplate(source, bos_token="<s>")


def _assistant_turn(prompt: str, start: str, end: str) -> str:
    head = prompt.index(start + "assistant\n") + len(start + "assistant\n")
    return prompt[head:prompt.index(end, head)]


def test_tiny_template_gets_the_hermes_format_and_the_parser_reads_it_back() -> None:
    """The tiny model's template knows no tools: the history is written in the Hermes format
    (tools in the system turn, calls as <tool_call> blocks, results as <tool_response>)."""
    tok = _Tok(TINY_TEMPLATE)
    messages, extra = chat_inputs(HISTORY, TOOLS, tok)
    assert extra == {}
    prompt = tok.chat_template.render(messages, **extra)
    assert prompt.startswith("<s><|im_start|>system\n# Tools")
    assert json.dumps(TOOLS[0]) in prompt
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>\n<tool_response>" \
           "\n3\n</tool_response><|im_end|>" in prompt
    turn = _assistant_turn(prompt, "<|im_start|>", "<|im_end|>")
    out = get_parser("hermes").extract(turn)
    assert (out.content, out.calls) == ("", [WEATHER, ADD])


def test_tool_aware_template_gets_tools_and_hf_shaped_calls() -> None:
    tok = _Tok(LLAMA_STYLE_TEMPLATE)
    messages, extra = chat_inputs(HISTORY, TOOLS, tok)
    assert extra == {"tools": TOOLS}
    assert messages[1]["tool_calls"][0] == {"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
    assert messages[2] == {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_1"}
    prompt = tok.chat_template.render(messages, **extra)
    assert "<|start|>ipython\nsunny, 21 C<|end|>" in prompt
    out = get_parser("llama3_json").extract(_assistant_turn(prompt, "<|start|>", "<|end|>"))
    assert (out.content, out.calls) == ("", [WEATHER, ADD])


def test_hermes_stream_sends_the_name_then_argument_pieces() -> None:
    """A call that names its function first is sent as it is written: its start as soon as
    the name is known, then each piece of the arguments object (nothing after it)."""
    stream = get_parser("hermes").stream()
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    deltas = []
    calls = []
    for ch in reply:
        out = stream.feed(ch)
        assert out.content == ""
        deltas += out.deltas or []
        calls += out.calls or []
    assert deltas[0] == CallDelta(0, "add", "")
    assert len(deltas) > 5 and all(d.index == 0 and d.name is None for d in deltas[1:])
    assert "".join(d.arguments for d in deltas) == '{"a": 1, "b": 2}'
    assert calls == [ADD]


def test_hermes_stream_sends_a_call_naming_its_function_last_whole() -> None:
    out = streamed("hermes", ['<tool_call>{"arguments": {"a": 1, "b": 2}, ',
                              '"name": "add"}</tool_call>'])
    assert out.calls == [ADD]
    assert out.deltas == [CallDelta(0, "add", ""), CallDelta(0, None, ADD.arguments)]


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
@pytest.mark.parametrize("parallel", [False, True])
def test_call_grammars_compile_and_their_sentences_parse(parser: str, parallel: bool) -> None:
    from aioengine.messages.sampling_params import StructuredOutputs
    from aioengine.structured import check_spec

    calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": {
        "type": "object", "properties": {"a": {"type": "integer"}}}},
        "required": ["name", "arguments"], "additionalProperties": False}
        for name in ("add", "get_weather")]
    grammar = get_parser(parser).call_grammar({"anyOf": calls}, parallel)
    check_spec(StructuredOutputs(grammar=grammar))
    assert ("call)*" in grammar or "body)*" in grammar) == parallel
    assert '"parameters"' in grammar if parser == "llama3_json" else '"arguments"' in grammar


# -- the server's reply format for auto mode (the tiny model never writes a call itself) ------

AUTO_REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
              '"Paris", "days": 2}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": '
              '{"a": 1, "b": 2}}\n</tool_call>')


def _auto_format(parallel: bool = True) -> Any:
    from aioengine.server.tool_replies import ToolChatFormat
    from aioengine.server.tools import ToolPlan

    plan = ToolPlan(mode="auto", tools=[], parallel=parallel)
    return ToolChatFormat("m", str, lambda t: b"", plan)


@pytest.mark.parametrize("parallel", [True, False])
@settings(deadline=None)  # a busy shared machine; the first example imports
@given(points=st.lists(st.integers(0, 500), max_size=20))
def test_auto_stream_chunks_are_reassembled_by_the_openai_sdk(parallel: bool,
                                                               points: list[int]) -> None:
    """An auto reply cut into any pieces: the chunks the server writes, fed to the SDK's own
    stream accumulator, give the content before the calls and the calls themselves."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    fmt = _auto_format(parallel)
    state = ChatCompletionStreamState()
    pieces = cuts(AUTO_REPLY, points)
    chunks = [fmt.chunk([fmt.role_choice(0)], False)]
    for i, piece in enumerate(pieces):
        finish = "stop" if i == len(pieces) - 1 else None
        chunks += [fmt.chunk([c], False) for c in fmt.delta_choices(0, piece, None, finish)]
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    (choice,) = state.get_final_completion().choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    calls = [(c.function.name, json.loads(c.function.arguments))
             for c in choice.message.tool_calls]
    expected = [("get_weather", {"city": "Paris", "days": 2}), ("add", {"a": 1, "b": 2})]
    assert calls == (expected if parallel else expected[:1])


def test_auto_whole_reply_has_content_and_calls() -> None:
    from aioengine.server.responses import ChoiceState

    state = ChoiceState(0)
    state.text, state.finish_reason = AUTO_REPLY, "stop"
    choice = _auto_format().full_choice(state)
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me check.\n"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "add"]
    state.finish_reason = "length"  # calls found, but the reply was cut: the reason stays
    assert _auto_format().full_choice(state)["finish_reason"] == "length"


def test_tool_plans_are_kept_per_tools_and_choice() -> None:
    from aioengine import SamplingParams
    from aioengine.server.protocol import CHAT_DECODER
    from aioengine.server.tools import plan_tools

    def plan(tools: list, choice: Any = "required") -> Any:
        req = CHAT_DECODER.decode(json.dumps({"messages": [{"role": "user", "content": "x"}],
                                              "tools": tools, "tool_choice": choice}))
        return plan_tools(req, SamplingParams(), "hermes")

    first, params = plan(TOOLS)
    again, params_again = plan(TOOLS)
    assert again is first and params_again.structured_outputs == params.structured_outputs
    other = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "integer"}}}}}]
    changed, changed_params = plan(other)
    assert changed is not first
    assert '"integer"' in changed_params.structured_outputs.grammar
    assert plan(TOOLS, "auto")[1].structured_outputs is None


@settings(deadline=None)
@given(st.lists(st.integers(0, 200), max_size=12))
def test_hermes_stream_never_sends_the_closing_tag_as_arguments(points: list[int]) -> None:
    reply = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2</tool_call>'
    out = streamed("hermes", cuts(reply, points))
    assert out.calls == [ParsedCall("add", '{"a": 1, "b": 2')]
    assert "".join(d.arguments for d in out.deltas or []) == '{"a": 1, "b": 2'
