"""``python -m aioengine.serve``: the OpenAI-compatible server as a program.

The listening socket is bound before the engine starts: a taken port or a foreign address fails
in milliseconds, with one log line, and starts no process. Connections made while the engine
starts wait in the socket's backlog and are answered once it is ready.

Being a program (not the library), it installs SIGINT/SIGTERM handlers in its own process: the
first signal stops accepting connections, lets in-flight requests finish for ``--grace-period``
seconds (then aborts the rest), shuts the engine down, and exits 0. A signal during engine
start-up (or a second one while stopping) cancels what is running, stops every child process,
and exits 128 + the signal's number (130 for Ctrl-C) after one log line. Before ``serve`` runs
(imports, arguments) ``aioengine.serve`` has made SIGINT exit 130 at once (nothing to stop yet);
``serve`` puts that handler back when it is done.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import socket
import ssl
import sys
import time
from collections.abc import Sequence
from typing import Any

from aioengine import AsyncMPClient, EngineConfig, EngineStartupError
from aioengine.field_args import add_field_args, values_from_args
from aioengine.hub import served_model_name
from aioengine.server.accept_log import guard_descriptors
from aioengine.server.auth import API_KEY_ENV, collect_keys
from aioengine.server.client_slot import ClientSlot
from aioengine.server.hosts import LOOPBACK_HOSTS, all_loopback
from aioengine.server.restart import EngineDied, Restarter
from aioengine.server.settings import ServerSettings
from aioengine.server.tool_parsers import parser_names

logger = logging.getLogger("aioengine.serve")


_BACKLOG = 128


class BindError(Exception):
    """The listening socket could not be opened (a port taken, an address not ours)."""


class StoppedBySignal(Exception):
    """``serve`` was cancelled by a signal: during start-up, or a second one while stopping."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to, as asyncio's ``create_server``
    opens them (``''``: every interface; SO_REUSEADDR; IPv6 sockets v6-only), so aiohttp can
    serve them later. With ``port`` 0 they all share the first one's free port."""
    where = f"cannot serve on {host}:{port}"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError as e:
        raise BindError(f"{where}: {e}") from e
    socks: list[socket.socket] = []
    try:
        for family, type_, proto, _, addr in dict.fromkeys(infos):  # unique, in order
            sock = socket.socket(family, type_, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:  # one server, one port (each 0 would differ)
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            sock.bind(addr)
            sock.listen(_BACKLOG)
            sock.setblocking(False)
    except OSError as e:
        for sock in socks:
            sock.close()
        raise BindError(f"{where}: {e}") from e
    return socks


def listen_urls(addresses: Sequence[tuple[Any, ...]], scheme: str = "http") -> list[str]:
    """URLs of bound socket addresses (IPv6 hosts in brackets)."""
    return [f"{scheme}://[{a[0]}]:{a[1]}" if ":" in a[0] else f"{scheme}://{a[0]}:{a[1]}"
            for a in addresses]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aioengine.serve",
        description="OpenAI-compatible HTTP server (chat and text completions) over aioengine")
    http = parser.add_argument_group("server")
    http.add_argument("--host", default="127.0.0.1",
                      help="address to bind (default: 127.0.0.1, loopback only)")
    http.add_argument("--port", type=int, default=8000,
                      help="TCP port; 0 picks a free one, logged at start (default: 8000)")
    http.add_argument("--idle-timeout", type=float, default=15.0, metavar="SECONDS",
                      help="close a connection that has not sent a whole request's headers "
                           "within this many seconds of connecting or of its last response "
                           "(slow or half-sent requests; default: %(default)s)")
    http.add_argument("--api-key", action="append", default=[], metavar="KEY",
                      help="require 'Authorization: Bearer KEY' on every route but /health and "
                           "/metrics (repeatable: any of the keys is accepted; also "
                           f"${API_KEY_ENV}); keys never appear in logs")
    http.add_argument("--api-key-file", default=None, metavar="PATH",
                      help="API keys, one per line ('#' comments), in addition to --api-key")
    http.add_argument("--ssl-certfile", default=None, metavar="PATH",
                      help="serve HTTPS with this certificate chain (PEM); needs --ssl-keyfile")
    http.add_argument("--ssl-keyfile", default=None, metavar="PATH",
                      help="the private key of --ssl-certfile (PEM)")
    http.add_argument("--on-engine-death", choices=("exit", "restart", "keep"),
                      default="exit",
                      help="when the engine dies while serving: 'exit' ends the streams in "
                           "flight with errors and exits with status 1, for a supervisor "
                           "(systemd, Kubernetes) to restart; 'restart' ends them the same "
                           "way and starts a new engine in this process after a backoff "
                           "(1, 2, 4, ... 30 s; /health answers 503 meanwhile); 'keep' stays "
                           "up answering 503 (default: exit)")
    http.add_argument("--tool-call-parser", default="hermes", choices=parser_names(),
                      help="the model family's tool-call format: how tool_choice 'auto' "
                           "finds the function calls in a reply, and what 'required'/named "
                           "choices write (hermes: Qwen/Hermes <tool_call> JSON, also what "
                           "templates without tools are given; llama3_json: Llama 3.x JSON; "
                           "default: %(default)s)")
    http.add_argument("--max-engine-restarts", type=int, default=5, metavar="N",
                      help="with --on-engine-death restart: after N restarts in a row (an "
                           "engine up for a minute ends the streak) exit with status 1 "
                           "(default: %(default)s)")
    http.add_argument("--log-level", default="INFO",
                      choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                      help="the least severe log records written to stderr (default: INFO)")
    # The rest of the server's flags are ServerSettings fields: help from their docstrings.
    add_field_args(http, ServerSettings, only=_SETTINGS_FLAGS, flags=_SETTINGS_FLAG_NAMES,
                   metavars=_SETTINGS_METAVARS)
    EngineConfig.add_cli_args(parser)
    return parser


# ServerSettings fields with a flag of their own (api_keys come from --api-key and
# --api-key-file; health_timeout and disconnect_poll_interval are for embedders).
_SETTINGS_FLAGS = ("model_name", "max_request_bytes", "default_max_tokens",
                   "shutdown_grace_period", "request_timeout", "protect_health_and_metrics",
                   "allowed_hosts", "allowed_origins", "allowed_methods", "allowed_headers",
                   "allow_credentials", "strict_request_fields", "response_store_max_count",
                   "response_store_max_bytes", "max_pooling_inputs")
_SETTINGS_FLAG_NAMES = {"model_name": "--served-model-name",
                        "shutdown_grace_period": "--grace-period"}
_SETTINGS_METAVARS = {"model_name": "NAME", "request_timeout": "SECONDS",
                      "shutdown_grace_period": "SECONDS", "max_request_bytes": "BYTES",
                      "response_store_max_count": "N", "response_store_max_bytes": "BYTES",
                      "max_pooling_inputs": "N",
                      "allowed_hosts": "HOST", "allowed_origins": "ORIGIN",
                      "allowed_methods": "METHOD", "allowed_headers": "HEADER"}


def tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """A server-side TLS context (Python's secure defaults), or None for plain HTTP;
    ValueError naming the file for a missing or unusable certificate or key."""
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        raise ValueError("--ssl-certfile and --ssl-keyfile go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load the TLS certificate {certfile!r} with key {keyfile!r}: "
                         f"{e}") from e
    return context


async def serve(config: EngineConfig, settings: ServerSettings, socks: list[socket.socket],
                grace_period: float, ssl_context: ssl.SSLContext | None = None,
                on_engine_death: str = "exit", idle_timeout: float = 15.0,
                max_engine_restarts: int = 5, restart_backoff: float = 1.0) -> None:
    """Start the engine, then serve HTTP on ``socks`` (from ``bind_listeners``) until a
    signal, or until the engine dies when ``on_engine_death`` is ``exit`` (``EngineDied``;
    with ``restart``: once ``max_engine_restarts`` restarts in a row did not keep it up);
    the sockets are closed on every way out."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None
    serving = False
    cancelled_by: list[signal.Signals] = []
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def on_signal(sig: signal.Signals) -> None:
        if serving and not stop.is_set():
            logger.info("%s: stopping (grace period %.1f s)", sig.name, grace_period)
            stop.set()
            return
        # During start-up, or a second signal during shutdown: stop waiting. This is the
        # only line: cancelling stops the engine's processes quietly.
        if not cancelled_by:
            logger.info("%s %s", sig.name, "again: stopping at once" if serving
                        else "during start-up: stopping")
        cancelled_by.append(sig)
        main_task.cancel()

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    # The server's own imports (aiohttp, jinja2, the routes) run in a thread while the engine
    # process starts (its torch import and model load take far longer), not before it.
    app_imports = asyncio.ensure_future(asyncio.to_thread(_server_imports))
    app_imports.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen once
    try:
        async with AsyncMPClient(config) as first:
            web, create_app = await app_imports
            # The app reads the client through the slot: --on-engine-death restart swaps a
            # fresh engine's client in. The app drains its generations itself
            # (ServerSettings.shutdown_grace_period); aiohttp's own wait is a backstop for the
            # rest, and it reads 0 as "no limit". keepalive_timeout also closes a connection
            # that has not sent a whole request's headers by then (aiohttp starts it at
            # accept): half-sent requests (slowloris) were held for as long as their client
            # liked.
            slot = ClientSlot(first)
            runner = web.AppRunner(create_app(slot, settings),
                                   shutdown_timeout=max(grace_period, 1.0), access_log=None,
                                   keepalive_timeout=idle_timeout)
            await runner.setup()
            try:
                for sock in socks:
                    await web.SockSite(runner, sock, ssl_context=ssl_context).start()
                logger.info("aioengine server listening on %s (model %r)",
                            " and ".join(listen_urls(runner.addresses,
                                                     "https" if ssl_context else "http")),
                            settings.model_name or served_model_name(config.model))
                serving = True
                await _until_stopped(slot, stop, on_engine_death,
                                     Restarter(config, max_engine_restarts, restart_backoff))
            finally:
                await runner.cleanup()
                if slot.current is not first:
                    await slot.current.shutdown()
        logger.info("server stopped")
    except asyncio.CancelledError:
        if cancelled_by:
            raise StoppedBySignal(cancelled_by[0]) from None
        raise
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)  # (it leaves Python's defaults)
            if previous[sig] is not None:
                signal.signal(sig, previous[sig])
        for sock in socks:
            sock.close()


def _server_imports() -> tuple[Any, Any]:
    from aiohttp import web

    from aioengine.server.app import create_app

    return web, create_app


async def _until_stopped(slot: ClientSlot, stop: asyncio.Event, on_engine_death: str,
                         restarter: Restarter) -> None:
    """Until a signal sets ``stop``; or until the engine dies, with the ``exit`` policy: its
    streams have ended with errors by then, and the cleanup that follows stops accepting.
    With ``restart``: a fresh engine, as often as ``restarter`` allows."""
    while True:
        up_since = time.monotonic()
        death = asyncio.ensure_future(slot.current.wait_dead())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({death, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            death.cancel()
            stopped.cancel()
        if stop.is_set() or not death.done() or death.cancelled():
            return
        if on_engine_death == "restart":
            if not await restarter.restart(slot, stop, death.result(),
                                           time.monotonic() - up_since):
                return
            continue
        if on_engine_death == "exit":
            logger.error("the engine died (%s): exiting with status 1 so that a supervisor "
                         "restarts the server", death.result())
            raise EngineDied(str(death.result()))
        logger.error("the engine died (%s): answering 503 until stopped "
                     "(--on-engine-death keep)", death.result())
        await stop.wait()
        return


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.shutdown_grace_period >= 0:
        parser.error(f"--grace-period must be >= 0, got {args.shutdown_grace_period}")
    if args.max_engine_restarts < 0:
        parser.error(f"--max-engine-restarts must be >= 0, got {args.max_engine_restarts}")
    if not args.idle_timeout > 0:
        parser.error(f"--idle-timeout must be positive, got {args.idle_timeout}")
    try:
        config = EngineConfig.from_cli_args(args)
        settings = ServerSettings(**values_from_args(ServerSettings, args, _SETTINGS_FLAGS),
                                  api_keys=collect_keys(args.api_key, args.api_key_file),
                                  tool_call_parser=args.tool_call_parser)
        ssl_context = tls_context(args.ssl_certfile, args.ssl_keyfile)
    except ValueError as e:
        parser.error(str(e))
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in [0, 65535], got {args.port}")
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    guard_descriptors(logger)
    try:
        socks = bind_listeners(args.host, args.port)
    except BindError as e:
        logger.error("%s", e)
        return 1
    if args.allowed_hosts is None and all_loopback(socks):
        settings = dataclasses.replace(settings, allowed_hosts=LOOPBACK_HOSTS)
    try:
        asyncio.run(serve(config, settings, socks, args.shutdown_grace_period, ssl_context,
                          args.on_engine_death, args.idle_timeout,
                          args.max_engine_restarts))
    except StoppedBySignal as e:
        return 128 + e.signum
    except EngineDied:
        return 1
    except (EngineStartupError, OSError) as e:  # OSError: e.g. an unwritable model cache
        logger.error("the engine failed to start: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
