"""Parametrisation of the transport contract suite: every test taking ``transport`` runs once
per implementation; one whose module does not import yet is skipped, not failed."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from transports import transport_names

T = TypeVar("T")


def _param(name: str) -> Any:
    try:
        importlib.import_module(f"transports.{name}")
    except ImportError as e:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"transports.{name}: {e}"))
    return pytest.param(name)


TRANSPORTS = [_param(name) for name in transport_names()]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """A transport short name: a private default address for the binding side."""
    return request.param


def run(coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
    """Run an async test body in a fresh loop, bounded so a hang fails instead of blocking."""
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())
