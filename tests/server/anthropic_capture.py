"""A loopback HTTP proxy, run in a thread, that records what a client sends (path, headers,
JSON body) and the text a stream carried back (a Messages API stream's ``text_delta``s, a
Responses API stream's ``response.output_text.delta``s)."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

_HOP = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


@dataclass
class Captured:
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0


@dataclass
class CapturingProxy:
    upstream: str
    requests: list[Captured] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    url: str = ""

    def __enter__(self) -> CapturingProxy:
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def start() -> None:
            app = web.Application(client_max_size=1 << 26)
            app.router.add_route("*", "/{tail:.*}", self._forward)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            started.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(start())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert started.wait(30), "the proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    async def _forward(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        seen = Captured(request.path_qs, dict(request.headers), body)
        self.requests.append(seen)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with aiohttp.ClientSession() as s, s.request(
                request.method, self.upstream + request.path_qs, data=raw,
                headers=headers) as up:
            data = await up.read()
            seen.status = up.status
        if up.headers.get("Content-Type", "").startswith("text/event-stream"):
            for line in data.decode().splitlines():
                if line.startswith("data: "):
                    event = json.loads(line[len("data: "):])
                    delta = event.get("delta")
                    if isinstance(delta, dict) and delta.get("type") == "text_delta":
                        self.texts.append(delta["text"])
                    elif event.get("type") == "response.output_text.delta":
                        self.texts.append(delta)
        return web.Response(status=up.status, body=data,
                            content_type=up.headers.get("Content-Type", "application/json")
                            .split(";")[0])
