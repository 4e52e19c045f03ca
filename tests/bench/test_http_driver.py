"""The HTTP driver against real aiohttp servers: one that closes the connection after every
streamed response without saying so (as llama-server does), and the SSE parsing of the usage
chunk and of errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from aioengine.bench.http_driver import HTTPDriver


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


PEERS = web.AppKey("peers", set)


def _server(close_after_stream: bool, stream_error: bool = False) -> web.Application:
    app = web.Application()
    app[PEERS] = set()

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert request.transport is not None
        app[PEERS].add(request.transport.get_extra_info("peername"))  # the client's port
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body["max_tokens"])
        if stream_error:
            await resp.write(b'data: {"error": {"message": "boom"}}\n\n')
        for i in range(n):
            chunk = {"choices": [{"index": 0, "text": f"t{i}"}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": n + 1}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        if close_after_stream:
            # Hang up once the response is out, with no "Connection: close" header beforehand:
            # a client that pools the connection finds it dead on its next request.
            transport = request.transport
            assert transport is not None
            asyncio.get_running_loop().call_soon(transport.close)
        return resp

    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/completions", completions)
    return app


async def _start(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _requests(url: str, count: int, sequential: bool) -> list:
    async with HTTPDriver(url) as d:
        assert d.model == "m"
        if sequential:
            return [await d.one([1, 2, 3], 4) for _ in range(count)]
        return list(await asyncio.gather(*(d.one([1, 2, 3], 4) for _ in range(count))))


@pytest.mark.parametrize("sequential", [True, False])
def test_survives_a_server_that_hangs_up_after_each_stream(sequential: bool) -> None:
    async def main() -> list:
        app = _server(close_after_stream=True)
        async for url in _start(app):
            recs = await _requests(url, 6, sequential)
            return [recs, len(app[PEERS])]
        raise AssertionError("unreachable")

    recs, connections = asyncio.run(main())
    assert [r.error for r in recs] == [None] * 6
    # The usage chunk's count wins over the 4 text chunks that arrived.
    assert [r.tokens for r in recs] == [5] * 6
    assert all(r.first_s is not None for r in recs)
    assert connections == 6  # one connection per request, never a pooled dead one


def test_a_stream_error_is_recorded_not_raised() -> None:
    async def main() -> list:
        async for url in _start(_server(close_after_stream=False, stream_error=True)):
            return await _requests(url, 2, True)
        raise AssertionError("unreachable")

    recs = asyncio.run(main())
    assert all(r.error is not None and "boom" in r.error for r in recs)
