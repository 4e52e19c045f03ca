"""A chat page over aioengine: an aiohttp app that owns an ``AsyncMPClient``, mounts the
OpenAI-compatible API at ``/api`` (``create_app``), and serves a static page whose JavaScript
streams the assistant's reply token by token from ``/api/v1/chat/completions``.

    python examples/chat_web/app.py --model tiny --port 8080   # then open http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web

from aioengine import AsyncMPClient, EngineConfig
from aioengine.server import create_app

STATIC = Path(__file__).resolve().parent / "static"


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


def create_chat_app(client: AsyncMPClient) -> web.Application:
    """The page and the API over a client someone else started (and will shut down)."""
    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_static("/static", STATIC)
    app.add_subapp("/api", create_app(client))
    return app


async def make_app(config: EngineConfig) -> web.Application:
    """Start the engine, then build the app; the app's cleanup shuts the engine down."""
    client = AsyncMPClient(config)
    await client.start()
    app = create_chat_app(client)

    async def stop_engine(_: web.Application) -> None:
        await client.shutdown()

    app.on_cleanup.append(stop_engine)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    EngineConfig.add_cli_args(parser)
    args = parser.parse_args()
    web.run_app(make_app(EngineConfig.from_cli_args(args)), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
