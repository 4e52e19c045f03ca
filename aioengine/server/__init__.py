"""The OpenAI-compatible HTTP server: ``create_app(client)`` to embed, or
``python -m aioengine.serve`` to run one."""

from aioengine.server.app import ServerSettings, create_app
from aioengine.server.client_slot import ClientSlot

__all__ = ["ClientSlot", "ServerSettings", "create_app"]
