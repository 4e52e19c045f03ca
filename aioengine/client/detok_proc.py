"""The detokenizer process (``EngineConfig.detokenize_in="process"``): a proxy between the host
and the engine that fills ``RequestDelta.new_text``, keeping text work off the host's loop.

    host --requests--> detokenizer --requests--> engine
    host <--outputs--- detokenizer <--outputs--- engine

Requests pass through it, so it sees every ``AddRequest`` before the engine can answer it.
The host binds the two host-facing channels; this process binds the two engine-facing ones.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import msgspec

from aioengine.messages.engine_io import (
    AbortRequests,
    AddRequest,
    ClientMessage,
    EngineFailure,
    EngineMessage,
    StepOutputs,
)
from aioengine.messages.launch import DetokLaunch
from aioengine.runtime.busy_loop import BusyLoopTarget, LoopContext
from aioengine.text.detokenize import EngineDetokenizer
from transports import (
    ChannelClosedError,
    PeerClosedError,
    SyncReader,
    SyncWriter,
    open_reader,
    open_writer,
)

logger = logging.getLogger(__name__)
POLL = 0.1  # seconds a blocking recv waits before looking at the shutdown flag


def make_detokenizer(args: bytes) -> DetokenizerProcess:
    return DetokenizerProcess(msgspec.msgpack.decode(args, type=DetokLaunch))


class DetokenizerProcess(BusyLoopTarget):
    def __init__(self, launch: DetokLaunch) -> None:
        self._launch = launch
        self._endpoints: list[SyncReader | SyncWriter] = []
        self._forwarder: threading.Thread | None = None
        self._out_decoder = msgspec.msgpack.Decoder(EngineMessage)
        self._encoder = msgspec.msgpack.Encoder()

    def init(self, ctx: LoopContext) -> dict[str, Any]:
        la = self._launch
        self._detok = EngineDetokenizer.from_path(la.tokenizer_path)
        self._host_in = self._open(open_reader(la.host_requests_url, bind=False,
                                               connect_timeout=la.connect_timeout))
        self._host_out = self._open(open_writer(la.host_outputs_url, bind=False,
                                                connect_timeout=la.connect_timeout))
        self._engine_out = self._open(open_writer(la.engine_transport, bind=True,
                                                  connect_timeout=la.connect_timeout))
        self._engine_in = self._open(open_reader(la.engine_transport, bind=True,
                                                 connect_timeout=la.connect_timeout))
        self._forwarder = threading.Thread(target=self._forward_requests, args=(ctx,),
                                           name="detok-requests", daemon=True)
        self._forwarder.start()
        return {"request_url": self._engine_out.address, "output_url": self._engine_in.address}

    def _open(self, endpoint: Any) -> Any:
        self._endpoints.append(endpoint)
        return endpoint

    def _forward_requests(self, ctx: LoopContext) -> None:
        """Host -> engine: register each request with the detokenizer before the engine sees it."""
        decoder = msgspec.msgpack.Decoder(ClientMessage)
        try:
            while not ctx.shutdown_requested:
                try:
                    msg = self._host_in.recv(timeout=POLL)
                except TimeoutError:
                    continue
                frame = bytes(msg.header)
                try:
                    req = decoder.decode(frame)
                except (msgspec.DecodeError, msgspec.ValidationError) as e:
                    # Not ours to judge: the engine answers an invalid request with an error
                    # output (and drops a malformed frame), as it does without us in between.
                    logger.warning("detokenizer: passing on a request frame it cannot "
                                   "decode: %s", e)
                    req = None
                if isinstance(req, AddRequest):
                    self._detok.add(req)
                elif isinstance(req, AbortRequests):
                    self._detok.drop(req.request_ids)
                self._engine_out.send(frame)
        except (PeerClosedError, ChannelClosedError) as e:
            ctx.request_shutdown(f"request channel closed: {e}")
        except Exception as e:
            logger.exception("detokenizer: forwarding requests failed")
            ctx.request_shutdown(f"forwarding requests failed: {e!r}")

    def step(self, ctx: LoopContext) -> None:
        """Engine -> host: fill in text, pass everything else through unchanged."""
        try:
            msg = self._engine_in.recv(timeout=POLL)
        except TimeoutError:
            return
        except PeerClosedError:
            ctx.request_shutdown("the engine closed its output channel")
            return
        decoded = self._out_decoder.decode(msg.header)
        if isinstance(decoded, StepOutputs):
            self._detok.fill(decoded.outputs)
            frame = self._encoder.encode(decoded)
        else:
            frame = bytes(msg.header)
        self._host_out.send(frame)
        if isinstance(decoded, EngineFailure):
            ctx.request_shutdown("the engine failed")

    def cleanup(self) -> None:
        for ep in self._endpoints:
            try:
                ep.close()
            except Exception:
                logger.exception("detokenizer: closing an endpoint failed")
        if self._forwarder is not None:
            self._forwarder.join(timeout=2 * POLL + 1)
