"""The engine process: ``EngineCore`` under the runtime's ``run_busy_loop``.

Started by the client through a ``Supervisor`` with the target
``"aioengine.engine.core_proc:make_engine_target"`` and ``EngineLaunch`` msgpack bytes, so the
host never imports torch (this module imports it only through the core, in ``init``).

Threads: an input thread decodes ``ClientMessage`` frames into a queue, an output thread encodes
``EngineMessage`` objects out of another; the busy loop only sees the queues. It blocks on the
input queue while idle, drains it between steps and queues one ``StepOutputs`` per step that
produced something; the output thread merges the ``StepOutputs`` that piled up while it was
behind into one frame. A fatal error fails every request, sends ``EngineFailure`` (best effort)
and leaves through ERROR.

Both queues are ``queue.SimpleQueue`` (C, one lock, no Python-level condition): with the model
in this process (uniproc), every Python instruction the I/O threads run holds the GIL the model
loop needs, so each hand-off must cost as few GIL round trips as possible.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
import traceback
from typing import Any

import msgspec

from aioengine.config import EngineConfig
from aioengine.messages.engine_io import (
    AbortRequests,
    AddRequest,
    ClientMessage,
    EngineFailure,
    EngineMessage,
    StepOutputs,
    UtilityCall,
    UtilityResult,
)
from aioengine.runtime.busy_loop import BusyLoopTarget, LoopContext
from transports import (
    ChannelClosedError,
    PeerClosedError,
    SyncReader,
    SyncWriter,
    open_reader,
    open_writer,
)

logger = logging.getLogger(__name__)

TARGET = "aioengine.engine.core_proc:make_engine_target"
IDLE_WAIT = 0.1  # seconds an idle loop blocks on the input queue before looking at shutdown
UTILITIES = ("get_stats", "reset_prefix_cache", "ping")


class EngineLaunch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the engine process needs; crosses spawn as msgpack."""

    config: bytes  # EngineConfig.to_msgpack()
    input_url: str  # the client's request writer (bound by the client); we connect a reader
    output_url: str  # the client's output reader (bound by the client); we connect a writer
    connect_timeout: float = 30.0

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)


class _Rejected(msgspec.Struct):
    """An add-request frame that failed validation but names its request: answer with an error
    instead of leaving the client waiting."""

    request_id: str
    error: str


def make_engine_target(args: bytes) -> EngineProc:
    try:
        launch = msgspec.msgpack.decode(args, type=EngineLaunch)
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed EngineLaunch arguments: {exc}") from exc
    return EngineProc(launch)


class EngineProc(BusyLoopTarget):
    def __init__(self, launch: EngineLaunch) -> None:
        self.launch = launch
        self.config = EngineConfig.from_msgpack(launch.config)
        self.core: Any = None  # EngineCore, built in init (it imports torch)
        self._in_q: queue.SimpleQueue[ClientMessage | _Rejected] = queue.SimpleQueue()
        self._out_q: queue.SimpleQueue[EngineMessage | None] = queue.SimpleQueue()
        self._reader: SyncReader | None = None
        self._writer: SyncWriter | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    # ---- lifecycle -------------------------------------------------------------------------
    def init(self, ctx: LoopContext) -> dict[str, Any]:
        from aioengine.engine.core import EngineCore

        la = self.launch
        self._reader = open_reader(la.input_url, bind=False, connect_timeout=la.connect_timeout)
        self._writer = open_writer(la.output_url, bind=False,
                                   connect_timeout=la.connect_timeout)
        self.core = EngineCore(self.config)
        for name, fn in (("engine-input", self._input_loop), ("engine-output",
                                                              self._output_loop)):
            thread = threading.Thread(target=fn, args=(ctx,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        # Everything built so far (modules, the model) lives as long as the process: keep it
        # out of the collector's scans, which otherwise stall steps and the interpreter's exit
        # for seconds on a loaded machine.
        gc.freeze()
        return self.core.ready_payload

    def step(self, ctx: LoopContext) -> None:
        core = self.core
        if not core.has_work():
            try:
                self._handle(self._in_q.get(timeout=IDLE_WAIT))
            except queue.Empty:
                self._guard(core.executor.check_health)  # a dead worker ends an idle engine too
                return
        in_q = self._in_q
        while not in_q.empty():  # everything that arrived meanwhile, before scheduling
            self._handle(in_q.get_nowait())  # this thread is the only consumer
        if not core.has_work():
            return
        deltas = self._guard(core.step)
        if deltas:
            self._out_q.put(StepOutputs(deltas, time.time()))

    def cleanup(self) -> None:
        self._stop.set()
        self._out_q.put(None)
        for thread in self._threads:
            thread.join(timeout=5.0)
        for endpoint in (self._reader, self._writer):
            if endpoint is not None:
                endpoint.close()
        if self.core is not None:
            self.core.shutdown()

    # ---- requests --------------------------------------------------------------------------
    def _handle(self, msg: ClientMessage | _Rejected) -> None:
        core = self.core
        if isinstance(msg, AddRequest):
            core.add_request(msg)
        elif isinstance(msg, AbortRequests):
            core.abort(msg.request_ids)
        elif isinstance(msg, _Rejected):
            core.reject(msg.request_id, msg.error)
        else:
            self._out_q.put(self._utility(msg))

    def _utility(self, call: UtilityCall) -> UtilityResult:
        try:
            if call.method == "get_stats":
                return UtilityResult(call.call_id, self.core.get_stats())
            if call.method == "reset_prefix_cache":
                self.core.reset_prefix_cache()
                return UtilityResult(call.call_id, True)
            if call.method == "ping":
                return UtilityResult(call.call_id, "pong")
            return UtilityResult(call.call_id, error=f"unknown utility method {call.method!r}; "
                                                     f"known: {list(UTILITIES)}")
        except Exception as exc:  # a utility's failure is the caller's, not the engine's
            logger.exception("utility %s failed", call.method)
            return UtilityResult(call.call_id, error=f"{type(exc).__name__}: {exc}")

    def _guard(self, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:
            self._fail(exc)
            raise

    def _fail(self, exc: BaseException) -> None:
        """Say why (EngineFailure first: the client fails every stream with EngineDeadError at
        once), then fail every request, then let the output thread flush (bounded)."""
        message = f"engine failed: {type(exc).__name__}: {exc}"
        logger.error(message)
        self._out_q.put(EngineFailure(message, "".join(traceback.format_exception(exc))))
        try:
            deltas = self.core.fail_all(message)
        except Exception:
            logger.exception("could not fail the open requests")
            deltas = []
        if deltas:
            self._out_q.put(StepOutputs(deltas, time.time()))
        self._out_q.put(None)
        for thread in self._threads:
            if thread.name == "engine-output":
                thread.join(timeout=5.0)

    # ---- I/O threads -----------------------------------------------------------------------
    def _input_loop(self, ctx: LoopContext) -> None:
        decoder = msgspec.msgpack.Decoder(ClientMessage)
        reader = self._reader
        assert reader is not None
        while not self._stop.is_set():
            try:
                frame = reader.recv(timeout=IDLE_WAIT)
            except TimeoutError:
                continue
            except PeerClosedError:
                ctx.request_shutdown("the client closed the request channel")
                return
            except ChannelClosedError:
                return
            except Exception as exc:
                ctx.request_shutdown(f"request channel failed: {type(exc).__name__}: {exc}")
                return
            try:
                self._in_q.put(decoder.decode(frame.header))
            except msgspec.ValidationError as exc:
                rid = _request_id_of(frame.header)
                logger.error("invalid request frame%s: %s",
                             "" if rid is None else f" for request {rid!r}", exc)
                if rid is not None:
                    self._in_q.put(_Rejected(rid, f"invalid request: {exc}"))
            except msgspec.DecodeError as exc:
                logger.error("dropped a malformed request frame (%d bytes): %s",
                             len(frame.header), exc)

    def _output_loop(self, ctx: LoopContext) -> None:
        encoder = msgspec.msgpack.Encoder()
        writer = self._writer
        out_q = self._out_q
        held: list[EngineMessage | None] = []  # taken from the queue by a merge, sent next
        assert writer is not None
        while True:
            msg = held.pop() if held else out_q.get()
            if msg is None:
                return
            if isinstance(msg, StepOutputs):
                msg = _merge_pending(msg, out_q, held)
            try:
                writer.send(encoder.encode(msg))
            except (PeerClosedError, ChannelClosedError):
                ctx.request_shutdown("the client closed the output channel")
                return
            except Exception as exc:
                logger.exception("output channel failed")
                ctx.request_shutdown(f"output channel failed: {type(exc).__name__}: {exc}")
                return


def _merge_pending(first: StepOutputs, out_q: queue.SimpleQueue[EngineMessage | None],
                   held: list[EngineMessage | None]) -> StepOutputs:
    """``first`` plus the ``StepOutputs`` queued right behind it, as one message: the client
    applies a frame's deltas in order, so steps merged this way read exactly as if sent one by
    one -- but cost one frame and one wake-up of the host. The first message of another kind
    (or the shutdown sentinel) ends the merge and goes to ``held``, to be sent next, in order."""
    if out_q.empty():
        return first
    outputs = list(first.outputs)
    timestamp = first.timestamp
    while not out_q.empty():
        nxt = out_q.get_nowait()
        if not isinstance(nxt, StepOutputs):
            held.append(nxt)
            break
        outputs += nxt.outputs
        timestamp = nxt.timestamp
    return StepOutputs(outputs, timestamp)


def _request_id_of(frame: Any) -> str | None:
    """The request id of a well-formed msgpack ``add`` map whose fields failed validation."""
    try:
        raw = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError:
        return None
    if isinstance(raw, dict) and raw.get("type") == "add" \
            and isinstance(raw.get("request_id"), str):
        return raw["request_id"]
    return None
