"""``--on-engine-death restart``: start a fresh engine in the server's process when its engine
dies, with a backoff and a cap, and swap its client into the app's ``ClientSlot``."""

from __future__ import annotations

import asyncio
import logging

from aioengine import AsyncMPClient, EngineConfig, EngineStartupError
from aioengine.server.client_slot import ClientSlot

logger = logging.getLogger("aioengine.serve")


class EngineDied(Exception):
    """The engine died while serving and the policy is to exit (``--on-engine-death exit``, or
    ``restart`` after too many restarts in a row)."""


class Restarter:
    """``--on-engine-death restart``: a fresh engine after a backoff (1, 2, 4, ... s, at most
    ``MAX_BACKOFF_S``), at most ``max_restarts`` in a row; an engine that stayed up for
    ``STREAK_RESET_S`` ends the streak."""

    MAX_BACKOFF_S = 30.0
    STREAK_RESET_S = 60.0

    def __init__(self, config: EngineConfig, max_restarts: int, backoff: float) -> None:
        self.config = config
        self.max_restarts = max_restarts
        self.backoff = backoff
        self.streak = 0

    async def restart(self, slot: ClientSlot, stop: asyncio.Event, cause: BaseException,
                      up_for: float) -> bool:
        """Put a started client in ``slot``: True; False when ``stop`` was set meanwhile.
        ``EngineDied`` once the streak reaches the cap."""
        from aioengine.server.errors import first_line  # aiohttp: not before the engine starts

        if up_for >= self.STREAK_RESET_S:
            self.streak = 0
        slot.restarting = True
        await slot.current.shutdown()  # the dead engine's processes: stopped, reaped
        while True:
            if self.streak >= self.max_restarts:
                logger.error("the engine died (%s) after %d restart(s) in a row: giving up, "
                             "exiting with status 1 (--max-engine-restarts %d)",
                             first_line(cause), self.streak, self.max_restarts)
                raise EngineDied(str(cause))
            delay = min(self.backoff * 2 ** self.streak, self.MAX_BACKOFF_S)
            self.streak += 1
            logger.error("the engine died (%s): restarting it in %.1f s (restart %d of at most "
                         "%d in a row; /health answers 503 meanwhile)", first_line(cause), delay,
                         self.streak, self.max_restarts)
            try:
                await asyncio.wait_for(stop.wait(), delay)
                return False
            except asyncio.TimeoutError:
                pass
            client = AsyncMPClient(self.config)
            started = asyncio.ensure_future(client.start())
            stopped = asyncio.ensure_future(stop.wait())
            swapped = False
            try:
                await asyncio.wait({started, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not started.done():
                    return False
                try:
                    started.result()
                except (EngineStartupError, OSError) as e:
                    cause = e
                    continue
                slot.swap(client)
                swapped = True
                logger.info("the engine is back after %d restart(s) in a row (%d in all)",
                            self.streak, slot.restarts)
                return True
            finally:
                stopped.cancel()
                if not started.done():
                    started.cancel()
                    await asyncio.gather(started, return_exceptions=True)
                if not swapped:
                    await client.shutdown()
