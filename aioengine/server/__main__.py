"""``python -m aioengine.serve``: the OpenAI-compatible server as a program.

Being a program (not the library), it installs SIGINT/SIGTERM handlers in its own process: the
first signal stops accepting connections, lets in-flight requests finish for ``--grace-period``
seconds (then aborts the rest), shuts the engine down, and exits 0. A signal during engine
start-up cancels the start-up.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from aioengine import AsyncMPClient, EngineConfig, EngineStartupError
from aioengine.server.app import ServerSettings, create_app

logger = logging.getLogger("aioengine.serve")


class BindError(Exception):
    """The listening socket could not be opened (a port taken, an address not ours)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aioengine.serve",
        description="OpenAI-compatible HTTP server (chat and text completions) over aioengine")
    http = parser.add_argument_group("server")
    http.add_argument("--host", default="127.0.0.1",
                      help="address to bind (default: 127.0.0.1, loopback only)")
    http.add_argument("--port", type=int, default=8000,
                      help="TCP port; 0 picks a free one, logged at start (default: 8000)")
    http.add_argument("--served-model-name", default=None,
                      help="the name clients send as 'model' (default: --model)")
    http.add_argument("--max-request-bytes", type=int, default=ServerSettings.max_request_bytes,
                      help="larger request bodies get 413 (default: %(default)s)")
    http.add_argument("--default-max-tokens", type=int, default=None,
                      help="max_tokens for chat requests that send none (default: up to the "
                           "context length)")
    http.add_argument("--grace-period", type=float, default=10.0,
                      help="seconds in-flight requests may run after SIGTERM/SIGINT before "
                           "they are aborted (default: %(default)s)")
    http.add_argument("--log-level", default="INFO",
                      choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    EngineConfig.add_cli_args(parser)
    return parser


async def serve(config: EngineConfig, settings: ServerSettings, host: str, port: int,
                grace_period: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None
    serving = False

    def on_signal(name: str) -> None:
        if serving and not stop.is_set():
            logger.info("%s: stopping (grace period %.1f s)", name, grace_period)
            stop.set()
        else:  # during start-up, or a second signal during shutdown: stop waiting
            logger.info("%s: cancelling", name)
            main_task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        async with AsyncMPClient(config) as client:
            # The app drains its generations itself (ServerSettings.shutdown_grace_period);
            # aiohttp's own wait is a backstop for the rest, and it reads 0 as "no limit".
            runner = web.AppRunner(create_app(client, settings),
                                   shutdown_timeout=max(grace_period, 1.0), access_log=None)
            await runner.setup()
            try:
                site = web.TCPSite(runner, host, port)
                try:
                    await site.start()
                except OSError as e:  # only this one: others are not about the address
                    raise BindError(f"cannot serve on {host}:{port}: {e}") from e
                bound = runner.addresses[0]
                logger.info("aioengine server listening on http://%s:%d (model %r)",
                            bound[0], bound[1], settings.model_name or config.model)
                serving = True
                await stop.wait()
            finally:
                await runner.cleanup()
        logger.info("server stopped")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.grace_period >= 0:
        parser.error(f"--grace-period must be >= 0, got {args.grace_period}")
    try:
        config = EngineConfig.from_cli_args(args)
        settings = ServerSettings(model_name=args.served_model_name,
                                  max_request_bytes=args.max_request_bytes,
                                  default_max_tokens=args.default_max_tokens,
                                  shutdown_grace_period=args.grace_period)
    except ValueError as e:
        parser.error(str(e))
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in [0, 65535], got {args.port}")
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(config, settings, args.host, args.port, args.grace_period))
    except asyncio.CancelledError:
        logger.info("stopped by a signal before the start-up or the shutdown completed")
    except (EngineStartupError, OSError) as e:  # OSError: e.g. an unwritable model cache
        logger.error("the engine failed to start: %s", e)
        return 1
    except BindError as e:
        logger.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
