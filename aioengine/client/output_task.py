"""The client's output task, apart from the client so that it can hold it only weakly."""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING

from aioengine.runtime.errors import EngineDeadError
from transports import AsyncReader
from transports.errors import ChannelClosedError, PeerClosedError

if TYPE_CHECKING:
    from aioengine.client.async_client import AsyncMPClient

logger = logging.getLogger(__name__)


async def output_loop(me: weakref.ref[AsyncMPClient], reader: AsyncReader,
                      replica: int = 0) -> None:
    """The client's output task (one per engine replica). It holds the client only weakly while
    it waits, so a client its owner dropped can be collected (and its finalizer stop the
    engine); a bound method here would keep it alive as long as the loop runs."""
    while True:
        error: EngineDeadError | None = None
        try:
            msg = await reader.recv()
        except ChannelClosedError:
            return  # closed by shutdown (or by the finalizer)
        except PeerClosedError as e:
            error = EngineDeadError(f"the engine closed its output channel: {e}")
        except Exception as e:
            logger.exception("output task failed")
            error = EngineDeadError(f"the client's output task failed: {e!r}")
        client = me()
        if client is None:
            return
        if error is not None:
            client._set_dead(error, replica)
            return
        try:
            if not client._on_frame(msg.header, replica):
                return
        except Exception as e:
            logger.exception("output task failed")
            client._set_dead(EngineDeadError(f"the client's output task failed: {e!r}"), replica)
            return
        del client  # no strong reference across the next await
