"""The chat page of ``examples/chat_web`` in a real headless Chromium: type a message and
watch the assistant's reply grow in the page as tokens stream in."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.server.app_server import serve_app
from tests.server.server_process import ROOT

pytestmark = pytest.mark.anyio

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    if not os.path.exists(CHROMIUM):
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "install_browser.sh")],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0 or not os.path.exists(CHROMIUM):
            pytest.skip(f"chromium is not installed and scripts/install_browser.sh could not "
                        f"install it: {r.stderr.strip()[-300:]}")
    return CHROMIUM


def _load_example():
    path = os.path.join(ROOT, "examples", "chat_web", "app.py")
    spec = importlib.util.spec_from_file_location("chat_web_app", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Records the reply's length each time a piece is appended, with a timestamp.
OBSERVE = """() => {
  window.__growth = [];
  new MutationObserver((records) => {
    const replies = document.querySelectorAll('.assistant');
    if (!replies.length) return;
    window.__growth.push([performance.now(), replies[replies.length - 1].textContent.length]);
  }).observe(document.getElementById('messages'),
             {childList: true, subtree: true, characterData: true});
}"""


@asynccontextmanager
async def _chat_server(engine) -> AsyncIterator[TestServer]:
    async with serve_app(_load_example().create_chat_app(engine)) as srv:
        yield srv


@asynccontextmanager
async def _chat_page(srv: TestServer, max_tokens: int) -> AsyncIterator[Any]:
    """The chat page in a headless Chromium, greedy, ``max_tokens`` per reply."""
    executable = _chromium()
    assert shutil.which(executable)
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, args=ARGS)
        try:
            page = await browser.new_page()
            await page.goto(str(srv.make_url("/")))
            await page.fill("#max-tokens", str(max_tokens))
            await page.fill("#temperature", "0")
            yield page
        finally:
            await browser.close()


async def _ask(page: Any, prompt: str) -> Any:
    """Send ``prompt`` from the page; the reply's element once it stopped streaming."""
    await page.fill("#prompt", prompt)
    await page.press("#prompt", "Enter")
    reply = page.locator(".assistant").last
    await reply.wait_for()
    await page.wait_for_function(
        "document.querySelector('.assistant').dataset.state !== 'streaming'", timeout=60_000)
    return reply


class _HeldClient:
    """The engine's client, except that a stream stops after its first pieces until the test
    lets it go on: what the page shows is then observed while the server still holds the rest
    of the reply, whatever the machine's speed (a state, not a timing)."""

    def __init__(self, client: Any, pieces: int = 3):
        self._client = client
        self._pieces = pieces
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self._held(self._client.generate(*args, **kwargs))

    def chat(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self._held(self._client.chat(*args, **kwargs))

    async def _held(self, stream: Any) -> AsyncIterator[Any]:
        n = 0
        async with aclosing(stream):
            async for out in stream:
                yield out
                n += 1
                if n == self._pieces and not self.release.is_set():
                    self.holding.set()
                    await self.release.wait()


async def test_chat_page_streams_reply(engine):
    held = _HeldClient(engine)
    async with _chat_server(held) as srv:
        async with _chat_page(srv, 128) as page:
            await page.evaluate(OBSERVE)
            await page.fill("#prompt", "Write me a poem about the sea")
            await page.press("#prompt", "Enter")
            await asyncio.wait_for(held.holding.wait(), 60)
            # The server holds the rest of the reply: the page shows the first pieces already,
            # still streaming.
            await page.wait_for_function(
                "document.querySelector('.assistant')?.textContent.length > 0", timeout=60_000)
            reply = page.locator(".assistant").last
            partial = await reply.text_content()
            assert await reply.get_attribute("data-state") == "streaming"
            held.release.set()
            await page.wait_for_function(
                "document.querySelector('.assistant').dataset.state !== 'streaming'",
                timeout=60_000)
            assert await reply.get_attribute("data-state") == "done"
            shown = await reply.text_content()
            growth = await page.evaluate("window.__growth")
            assert await page.locator(".user").text_content() == "Write me a poem about the sea"
        # The reply grew, never shrinking, from the part shown while held to the whole.
        assert 0 < len(partial) < len(shown) and shown.startswith(partial)
        lengths = [n for _, n in growth if n > 0]
        assert lengths == sorted(lengths) and len(set(lengths)) >= 2, growth
        # And it is what the API gives for the same conversation (greedy).
        body = {"messages": [{"role": "user", "content": "Write me a poem about the sea"}],
                "max_tokens": 128, "temperature": 0}
        async with aiohttp.ClientSession() as s, \
                s.post(srv.make_url("/api/v1/chat/completions"), json=body) as resp:
            expected = (await resp.json())["choices"][0]["message"]["content"]
        assert shown == expected


async def test_json_mode_toggle_constrains_the_reply(engine):
    """The page's "JSON mode" box sends ``response_format: json_object``: the reply shown is
    the API's constrained answer for the same conversation, one JSON object."""
    prompt = "Describe the sea as JSON"
    async with _chat_server(engine) as srv:
        async with _chat_page(srv, 400) as page:
            await page.check("#json-mode")
            shown = await (await _ask(page, prompt)).text_content()
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 400,
                "temperature": 0}
        async with aiohttp.ClientSession() as s:
            answers = {}
            for mode, extra in (("json", {"response_format": {"type": "json_object"}}),
                                ("text", {})):
                async with s.post(srv.make_url("/api/v1/chat/completions"),
                                  json={**body, **extra}) as resp:
                    answers[mode] = (await resp.json())["choices"][0]
    assert shown == answers["json"]["message"]["content"]
    assert shown != answers["text"]["message"]["content"]
    if answers["json"]["finish_reason"] == "stop":
        assert isinstance(json.loads(shown), dict), shown
    else:  # cut by max_tokens: still the start of an object
        assert shown.startswith("{"), shown
