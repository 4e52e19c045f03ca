"""The client's output task, apart from the client so that it can hold it only weakly."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

from aioengine.client.engine_death import EngineDeath
from aioengine.client.engine_messages import EngineMessageRouter
from aioengine.runtime.errors import EngineDeadError
from transports import AsyncReader
from transports.errors import ChannelClosedError, PeerClosedError

logger = logging.getLogger(__name__)


async def output_loop(router: EngineMessageRouter, death: EngineDeath,
                      abort_soon: weakref.WeakMethod[Callable[[str], None]],
                      reader: AsyncReader) -> None:
    """The client's output task: each frame to ``router``, the end of the channel to
    ``death``. Neither holds the client; its ``abort_soon`` is held only weakly while the task
    waits, so a client its owner dropped can be collected (and its finalizer stop the engine);
    a bound method here would keep it alive as long as the loop runs."""
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
        abort = abort_soon()
        if abort is None:
            return  # the client was collected
        if error is not None:
            death.declare(error)
            return
        try:
            if not router.on_frame(msg.header, abort):
                return
        except Exception as e:
            logger.exception("output task failed")
            death.declare(EngineDeadError(f"the client's output task failed: {e!r}"))
            return
        del abort  # no strong reference to the client across the next await
