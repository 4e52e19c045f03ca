"""The real clients of the Messages API against a real ``python -m aioengine.serve``: the
official ``anthropic`` SDK (whole and streamed replies, a forced tool call) and the Claude Code
CLI (``claude -p``), whose replies must be the text the server streamed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import jsonschema
import pytest

from tests.server.anthropic_capture import CapturingProxy
from tests.server.npm_clis import npm_cli
from tests.server.server_process import ServerProcess
from tests.server.test_tools import WEATHER

KEY = "sk-ant-clients-0123"
CLAUDE_CODE = "@anthropic-ai/claude-code"
GREEDY = {"temperature": 0.0}  # the SDK (2.x) has no temperature argument any more


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--max-model-len", "2048", "--num-kv-blocks", "1024", "--api-key", KEY)
    try:
        yield srv
    finally:
        assert srv.terminate() == 0


@pytest.fixture
def sdk(server: ServerProcess):
    anthropic = pytest.importorskip("anthropic")
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0,
                             timeout=120) as client:
        yield client


def test_sdk_whole_and_streamed_replies(sdk):
    msg = sdk.messages.create(model="tiny", max_tokens=12, system="Be brief.", extra_body=GREEDY,
                              messages=[{"role": "user", "content": "Say hi"}])
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 12
    with sdk.messages.stream(model="tiny", max_tokens=12, system="Be brief.", extra_body=GREEDY,
                             messages=[{"role": "user", "content": "Say hi"}]) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text == msg.content[0].text  # greedy: the same
    assert final.stop_reason == msg.stop_reason
    assert final.usage.output_tokens == msg.usage.output_tokens
    count = sdk.messages.count_tokens(model="tiny", system="Be brief.",
                                      messages=[{"role": "user", "content": "Say hi"}])
    assert count.input_tokens == msg.usage.input_tokens


def test_sdk_streams_a_forced_tool_call(sdk):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
    with sdk.messages.stream(model="tiny", max_tokens=300, tools=tools,
                             tool_choice={"type": "tool", "name": "get_weather"},
                             messages=[{"role": "user", "content": "Weather in Paris?"}]
                             ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (call,) = final.content
    assert call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER)


def test_claude_code_print_mode_answers_with_our_text(server, tmp_path):
    exe = npm_cli(CLAUDE_CODE, "claude")
    with CapturingProxy(server.url) as proxy:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
               "ANTHROPIC_BASE_URL": proxy.url, "ANTHROPIC_API_KEY": KEY,
               # Claude Code asks for its own models by name otherwise: a 404 here.
               "ANTHROPIC_MODEL": "tiny", "ANTHROPIC_SMALL_FAST_MODEL": "tiny",
               "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
               "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        # Its default prompt (24 tools, ~40k tokens) is far past tiny's 2048-token context: a
        # short system prompt and no tools fit.
        r = subprocess.run([exe, "-p", "say hi", "--system-prompt", "Be brief.", "--tools", "",
                            "--disable-slash-commands", "--strict-mcp-config"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, (r.stdout, r.stderr, proxy.requests)
    (request,) = [q for q in proxy.requests if q.path.startswith("/v1/messages")]
    assert request.path == "/v1/messages?beta=true" and request.status == 200
    assert request.body["stream"] is True and request.body["model"] == "tiny"
    assert request.headers["x-api-key"] == KEY
    assert proxy.texts and r.stdout.strip() == "".join(proxy.texts).strip(), (
        r.stdout, proxy.texts)
