"""Streaming requests to any OpenAI-compatible server (``/v1/completions`` with token-id
prompts, Server-Sent Events), for the ``serve`` suite's ``--endpoint`` mode."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from aioengine.bench.latency import RequestRecord


class HTTPDriver:
    """``async with HTTPDriver(url) as d: record = await d.one(prompt_ids, max_tokens)``."""

    def __init__(self, base_url: str, request_timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._session: aiohttp.ClientSession | None = None
        self.model: str | None = None

    async def __aenter__(self) -> HTTPDriver:
        # A fresh connection per request, as independent clients would have, closed after its
        # response: servers may hang up after a stream without a "Connection: close" header
        # (llama-server does), and a pooled connection they closed fails the next request
        # ("Can not write request body", "Server disconnected"). A localhost TCP handshake
        # is cheap next to a request, and the same for every server measured.
        self._session = aiohttp.ClientSession(
            timeout=self._timeout, connector=aiohttp.TCPConnector(limit=0, force_close=True))
        try:
            self.model = await self._served_model()
        except BaseException:
            await self._session.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _served_model(self) -> str:
        assert self._session is not None
        url = f"{self.base_url}/v1/models"
        try:
            async with self._session.get(url) as resp:
                body = await resp.text()
                if resp.status != 200:
                    raise RuntimeError(f"GET {url} answered {resp.status}: {body[:300]}")
        except aiohttp.ClientError as e:
            raise RuntimeError(f"cannot reach the endpoint {self.base_url}: {e}") from e
        try:
            return str(json.loads(body)["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise RuntimeError(f"GET {url} did not list a model: {body[:300]}") from e

    async def one(self, prompt: list[int], max_tokens: int) -> RequestRecord:
        """Send one greedy streaming completion; errors are recorded, never raised."""
        assert self._session is not None
        payload: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
        rec = RequestRecord(sent_s=time.perf_counter())
        usage_tokens: int | None = None
        try:
            async with self._session.post(f"{self.base_url}/v1/completions",
                                          json=payload) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    rec.finish(time.perf_counter())
                    return rec
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    chunk = json.loads(data)
                    now = time.perf_counter()
                    if "error" in chunk:
                        rec.error = f"stream error: {str(chunk['error'])[:300]}"
                        break
                    if any(c.get("text") for c in chunk.get("choices") or ()):
                        # Servers skip tokens that add no text yet: the exact count comes
                        # from the usage chunk; chunks are the arrivals.
                        rec.on_output(now, rec.tokens + 1)
                    usage = chunk.get("usage")
                    if usage and isinstance(usage.get("completion_tokens"), int):
                        usage_tokens = usage["completion_tokens"]
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            rec.error = f"{type(e).__name__}: {e}"
        rec.finish(time.perf_counter())
        if usage_tokens is not None and rec.first_s is not None:
            rec.tokens = usage_tokens
        return rec
