"""The OpenAI-compatible HTTP server: ``create_app(client)`` to embed, or
``python -m aioengine.serve`` to run one."""

from aioengine.server.app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
