"""The OpenAI-compatible HTTP server: ``create_app(client)`` to embed, or
``python -m aioengine.serve`` to run one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aioengine.server.client_slot import ClientSlot
from aioengine.server.settings import ServerSettings

if TYPE_CHECKING:
    from aioengine.server.app import create_app

__all__ = ["ClientSlot", "ServerSettings", "create_app"]


def __getattr__(name: str) -> Any:
    # create_app on first use: importing the package (as ``python -m aioengine.serve`` does)
    # does not import aiohttp before the engine is started
    if name == "create_app":
        from aioengine.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
