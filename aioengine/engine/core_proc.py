"""The engine process: ``EngineCore`` under the runtime's ``run_busy_loop``.

Started by the client through a ``Supervisor`` with the target
``"aioengine.engine.core_proc:make_engine_target"`` and ``EngineLaunch`` msgpack bytes, so the
host never imports torch (this module imports it only through the core, in ``init``).

Threads: an input thread decodes ``ClientMessage`` frames into a queue, an output thread sends
``EngineMessage`` frames out of another; the busy loop only sees the queues. It blocks on the
input queue while idle, drains it between steps and queues one ``StepOutputs`` per step that
produced something, already encoded; the output thread merges the ``StepOutputs`` that piled up
while it was behind into one frame.

Last words: a fatal error (a worker died, the executor raised) queues ``EngineFailure`` naming the
cause, then one error output for every open request, and the engine waits for its output thread
to hand all of them to the transport (``FINAL_DRAIN_TIMEOUT`` at most: only a client that stopped
reading makes it wait that long) before it leaves through ERROR; the transport's close then
flushes what it still holds to a live peer (zmq's linger, uds's flush; shm frames already sit in
the shared ring). So a client that is reading sees every request's error, then the death.

With the model in this process (uniproc), every Python instruction the I/O threads run holds the
GIL the model loop needs, and each time they take the GIL back they wait for the loop to let go
of it (a futex wake-up on both sides). So the I/O threads do as little Python as they can: the
loop encodes its messages itself (a few us for a step's frame) and the output thread's burst is
just the transport's send; the input thread sleeps in a recv without timeout (``close()`` wakes
it) instead of waking on a timeout. Both queues are ``queue.SimpleQueue`` (C, one lock,
no Python-level condition): one wake-up per hand-off.

Both I/O threads run under ``SCHED_BATCH`` (Linux): a batch thread that wakes up never preempts
the thread running on the CPU it lands on. When the model computes on the CPU here, they also
run on the loop's CPU and get it from the loop when a step has queued output
(``io_threads.ModelCpuFollower``): so they never hold the GIL while the model computes.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from aioengine.config import EngineConfig
from aioengine.engine.io_threads import ModelCpuFollower, yield_to_model
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
from aioengine.messages.launch import EngineLaunch, engine_channel_capacity
from aioengine.runtime.busy_loop import BusyLoopTarget, LoopContext
from transports import (
    ChannelClosedError,
    PeerClosedError,
    SyncReader,
    SyncWriter,
    open_reader,
    open_writer,
)

if TYPE_CHECKING:  # the core imports torch: only inside the engine process, in init
    from aioengine.engine.core import EngineCore

logger = logging.getLogger(__name__)

IDLE_WAIT = 0.1  # seconds an idle loop blocks on the input queue before looking at shutdown
# Bounds the wait for the output thread on the way out. Generous: on a loaded machine the thread
# may wait seconds for a CPU, and the frames it still holds are the clients' only news of why
# their requests ended. A client that is gone ends the wait at once (the send fails).
FINAL_DRAIN_TIMEOUT = 30.0

Frame = tuple[EngineMessage, bytes]
"""A message for the output thread and its encoding (the loop encodes: see the module doc)."""


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
        self.core: EngineCore | None = None  # built in init (it imports torch)
        self._in_q: queue.SimpleQueue[ClientMessage | _Rejected] = queue.SimpleQueue()
        self._out_q: queue.SimpleQueue[Frame | None] = queue.SimpleQueue()
        self._encoder = msgspec.msgpack.Encoder()  # the loop's; the output thread has its own
        self._reader: SyncReader | None = None
        self._writer: SyncWriter | None = None
        self._threads: list[threading.Thread] = []
        self._follower: ModelCpuFollower | None = None  # uniproc on CPU: see io_threads
        self._draining = False  # the output thread was told to finish (``_drain_output``)

    # ---- lifecycle -------------------------------------------------------------------------
    def init(self, ctx: LoopContext) -> dict[str, Any]:
        from aioengine.engine.core import EngineCore

        # A connect waits for the client's event loop to answer (a rendezvous), and while the
        # engine starts that loop shares its process with the server's imports and tokenizer
        # load, a visible and variable part of the engine's start-up (docs/benchmarks.md). So it
        # runs beside the model load.
        connected = threading.Event()
        failed: list[BaseException] = []
        threading.Thread(target=self._connect, args=(connected, failed), name="engine-connect",
                         daemon=True).start()
        self.core = EngineCore(self.config)
        connected.wait()
        if failed:
            raise failed[0]
        for name, fn in (("engine-input", self._input_loop), ("engine-output",
                                                              self._output_loop)):
            thread = threading.Thread(target=fn, args=(ctx,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.config.colocate_io_threads and self.core.executor.computes_here_on_cpu:
            self._follower = ModelCpuFollower(self._threads)
        # Everything built so far (modules, the model) lives as long as the process: keep it
        # out of the collector's scans, which otherwise stall steps and the interpreter's exit
        # for seconds on a loaded machine.
        gc.freeze()
        return self.core.ready_payload

    def _connect(self, connected: threading.Event, failed: list[BaseException]) -> None:
        la = self.launch
        try:
            self._reader = open_reader(la.input_url, bind=False,
                                       connect_timeout=la.connect_timeout)
            self._writer = open_writer(la.output_url, bind=False,
                                       capacity=engine_channel_capacity(la.output_url),
                                       connect_timeout=la.connect_timeout)
        except BaseException as exc:  # raised in init's thread
            failed.append(exc)
        finally:
            connected.set()

    def step(self, ctx: LoopContext) -> None:
        core = self.core
        assert core is not None  # built by init
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
            self._emit(StepOutputs(deltas, time.time()))

    def _emit(self, msg: EngineMessage) -> None:
        self._send((msg, self._encoder.encode(msg)))

    def _send(self, frame: Frame) -> None:
        follower = self._follower
        if follower is not None:
            follower.expect()
        self._out_q.put(frame)
        if follower is not None:
            follower.hand_over()

    def cleanup(self) -> None:
        self._drain_output()
        if self._reader is not None:
            self._reader.close()  # wakes the input thread's recv with ChannelClosedError
        for thread in self._threads:
            thread.join(timeout=5.0)
        if self._writer is not None:
            self._writer.close()  # flushes what the transport still holds to a live client
        if self.core is not None:
            self.core.shutdown()

    def _drain_output(self) -> None:
        """Let the output thread send everything queued so far, then end (bounded by
        ``FINAL_DRAIN_TIMEOUT``); once only, on the way out."""
        if self._draining:
            return
        self._draining = True
        self._out_q.put(None)
        for thread in self._threads:
            if thread.name != "engine-output":
                continue
            thread.join(timeout=FINAL_DRAIN_TIMEOUT)
            if thread.is_alive():
                logger.warning("the output thread did not send the engine's last %d frame(s) "
                               "within %g s (is the client reading?); they may be lost",
                               self._out_q.qsize(), FINAL_DRAIN_TIMEOUT)

    # ---- requests --------------------------------------------------------------------------
    def _handle(self, msg: ClientMessage | _Rejected) -> None:
        core = self.core
        assert core is not None  # built by init
        if isinstance(msg, AddRequest):
            core.add_request(msg)
        elif isinstance(msg, AbortRequests):
            core.abort(msg.request_ids)
        elif isinstance(msg, _Rejected):
            core.reject(msg.request_id, msg.error)
        else:
            result = self._utility(msg)
            try:
                frame = self._encoder.encode(result)
            except (TypeError, msgspec.EncodeError) as exc:  # a result msgpack cannot carry
                logger.error("utility %s returned an unencodable result: %s", msg.method, exc)
                result = UtilityResult(msg.call_id, error=f"utility {msg.method!r} returned "
                                                          f"an unencodable result: {exc}")
                frame = self._encoder.encode(result)
            self._send((result, frame))

    def _utility(self, call: UtilityCall) -> UtilityResult:
        method = UTILITIES.get(call.method)
        if method is None:
            return UtilityResult(call.call_id, error=f"unknown utility method {call.method!r}; "
                                                     f"known: {list(UTILITIES)}")
        assert self.core is not None  # built by init
        try:
            return UtilityResult(call.call_id, method(self.core))
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
        once), then fail every request, then let the output thread send it all (bounded)."""
        message = f"engine failed: {type(exc).__name__}: {exc}"
        logger.error(message)
        self._emit(EngineFailure(message, "".join(traceback.format_exception(exc))))
        try:
            self._refuse_queued(message)
            deltas = self.core.fail_all(message) if self.core is not None else []
        except Exception:
            logger.exception("could not fail the open requests")
            deltas = []
        if deltas:
            self._emit(StepOutputs(deltas, time.time()))
        self._drain_output()

    def _refuse_queued(self, message: str) -> None:
        """Answer what the input thread queued but the loop never took: each request ends with
        the failure's error (``fail_all`` sends it), each utility call gets it as its error."""
        core = self.core
        assert core is not None  # _fail runs only once the core exists
        while not self._in_q.empty():
            msg = self._in_q.get_nowait()
            if isinstance(msg, AddRequest):
                core.reject(msg.request_id, message)
            elif isinstance(msg, _Rejected):
                core.reject(msg.request_id, msg.error)
            elif isinstance(msg, UtilityCall):
                self._emit(UtilityResult(msg.call_id, error=message))
            # an AbortRequests needs no answer: every request is ending anyway

    # ---- I/O threads -----------------------------------------------------------------------
    def _input_loop(self, ctx: LoopContext) -> None:
        yield_to_model()
        decoder = msgspec.msgpack.Decoder(ClientMessage)
        reader = self._reader
        assert reader is not None
        while True:
            try:
                frame = reader.recv()  # no timeout: cleanup's close() ends the wait
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
        yield_to_model()
        encoder = msgspec.msgpack.Encoder()  # only for merged frames
        writer = self._writer
        out_q = self._out_q
        held: list[Frame | None] = []  # taken from the queue by a merge, sent next
        assert writer is not None
        while True:
            item = held.pop() if held else out_q.get()
            if item is None:
                return
            msg, data = item
            if isinstance(msg, StepOutputs) and not out_q.empty():
                merged = _merge_pending(msg, out_q, held)
                if merged is not msg:
                    data = encoder.encode(merged)
            try:
                writer.send(data)
                if self._follower is not None:  # set by init after this thread started
                    self._follower.sent()
            except (PeerClosedError, ChannelClosedError):
                ctx.request_shutdown("the client closed the output channel")
                return
            except Exception as exc:
                logger.exception("output channel failed")
                ctx.request_shutdown(f"output channel failed: {type(exc).__name__}: {exc}")
                return


def _get_stats(core: EngineCore) -> object:
    return core.get_stats()


def _reset_prefix_cache(core: EngineCore) -> object:
    core.reset_prefix_cache()
    return True


def _ping(core: EngineCore) -> object:
    return "pong"


UTILITIES: dict[str, Callable[[EngineCore], object]] = {
    "get_stats": _get_stats, "reset_prefix_cache": _reset_prefix_cache, "ping": _ping}
"""The utility calls the engine answers (``UtilityCall.method``), each with its result."""


def _merge_pending(first: StepOutputs, out_q: queue.SimpleQueue[Frame | None],
                   held: list[Frame | None]) -> StepOutputs:
    """``first`` plus the ``StepOutputs`` queued right behind it, as one message: the client
    applies a frame's deltas in order, so steps merged this way read exactly as if sent one by
    one -- but cost one frame and one wake-up of the host. The first message of another kind
    (or the shutdown sentinel) ends the merge and goes to ``held``, to be sent next, in order."""
    merged = first
    while not out_q.empty():
        item = out_q.get_nowait()
        if item is None or not isinstance(item[0], StepOutputs):
            held.append(item)
            break
        merged = StepOutputs(merged.outputs + item[0].outputs, item[0].timestamp)
    return merged  # ``first`` itself if nothing merged: the caller keeps its encoding


def _request_id_of(frame: Any) -> str | None:
    """The request id of a well-formed msgpack ``add`` map whose fields failed validation."""
    try:
        raw = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError:
        return None
    if isinstance(raw, dict) and raw.get("type") == "add" \
            and isinstance(raw.get("request_id"), str):
        rid: str = raw["request_id"]
        return rid
    return None
