"""Receiving what the engine sends: each frame the output task reads is decoded (typed, so a
malformed frame is a clean error) and routed: step outputs to their requests' streams, utility
results to their calls' futures, an ``EngineFailure`` to the client's ``EngineDeath``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import msgspec

from aioengine.client.backend_types import CallFuture
from aioengine.client.engine_death import EngineDeath
from aioengine.client.request_stream import RequestStream
from aioengine.messages.engine_io import EngineFailure, EngineMessage, StepOutputs, UtilityResult
from aioengine.runtime.errors import EngineDeadError


class EngineMessageRouter:
    __slots__ = ("_by_wire", "_calls", "_death", "_decoder")

    def __init__(self, by_wire: Mapping[str, RequestStream],
                 calls: dict[int, CallFuture], death: EngineDeath) -> None:
        self._by_wire = by_wire  # the client's open streams, by the id the engine knows
        self._calls = calls  # the client's pending utility calls, by call id
        self._death = death
        self._decoder = msgspec.msgpack.Decoder(EngineMessage)

    def on_frame(self, header: memoryview, abort_soon: Callable[[str], None]) -> bool:
        """One engine message; False when the output task must end. ``abort_soon(wire_id)``
        tells the engine about a request that a stop string finished here."""
        try:
            decoded = self._decoder.decode(header)
        except msgspec.DecodeError as e:
            self._death.declare(EngineDeadError(f"undecodable frame from the engine: {e}"))
            return False
        if isinstance(decoded, StepOutputs):
            self._on_outputs(decoded, abort_soon)
        elif isinstance(decoded, UtilityResult):
            self._on_result(decoded)
        elif isinstance(decoded, EngineFailure):
            detail = f"\n{decoded.traceback}" if decoded.traceback else ""
            self._death.declare(
                EngineDeadError(f"the engine failed: {decoded.message}{detail}"))
            return False
        return True

    def _on_outputs(self, step: StepOutputs, abort_soon: Callable[[str], None]) -> None:
        now = time.time()
        streams = self._by_wire
        for delta in step.outputs:
            stream = streams.get(delta.request_id)
            if stream is None:
                continue  # aborted or abandoned meanwhile
            if stream.state.apply(delta, now):
                abort_soon(delta.request_id)  # a stop string ended it; tell the engine
            stream.event.set()

    def _on_result(self, res: UtilityResult) -> None:
        fut = self._calls.pop(res.call_id, None)
        if fut is None or fut.done():
            return
        if res.error is not None:
            fut.set_exception(RuntimeError(f"engine call failed: {res.error}"))
        else:
            fut.set_result(res.result)
