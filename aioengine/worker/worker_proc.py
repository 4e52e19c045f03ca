"""The worker process: one tensor-parallel rank under the runtime's ``run_busy_loop``.

Start it with a ``Supervisor`` and ``ChildSpec(name, WORKER_TARGET, WorkerLaunch(...).encode())``
(both from ``aioengine.messages.launch``);
the protocol (who binds what, who answers what) is in ``aioengine/worker/README.md``.

init: join torch.distributed (world_size > 1), load the model, size the KV cache (the launch's
block count, or planned here and agreed as the minimum over ranks), connect a broadcast reader
to the step channel and a writer to this rank's result channel; READY carries the block count.
step: receive one ``WorkerInbound`` frame (short timeout slices; the shutdown path also closes
the reader), decode it with the channel's typed decoder, run it. Rank 0 answers every frame;
other ranks answer only with errors. An exception while running a step or call is answered with
a fatal ``WorkerError`` (with traceback) and then raised, so the worker exits through ERROR. A
malformed frame or an unknown call is answered with a non-fatal ``WorkerError`` and skipped.
"""

from __future__ import annotations

import gc
import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from aioengine.messages.launch import WorkerLaunch
from aioengine.messages.worker_io import (
    StepInput,
    WorkerCall,
    WorkerCallResult,
    WorkerError,
    WorkerInbound,
    WorkerOutbound,
)
from aioengine.runtime.busy_loop import BusyLoopTarget, LoopContext
from transports import (
    ChannelClosedError,
    PeerClosedError,
    SyncReader,
    SyncWriter,
    open_broadcast_reader,
    open_writer,
)

if TYPE_CHECKING:  # the runner imports torch: only inside the worker process, in init
    from aioengine.worker.encoder.runner import EncoderRunner
    from aioengine.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

RECV_SLICE = 0.5  # seconds per blocking receive, so shutdown is noticed even without a wake-up


def make_worker_target(args: bytes) -> WorkerProc:
    try:
        launch = msgspec.msgpack.decode(args, type=WorkerLaunch)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"malformed WorkerLaunch arguments: {exc}") from exc
    return WorkerProc(launch)


def error_reply(rank: int, exc: BaseException, fatal: bool) -> WorkerError:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return WorkerError(rank, type(exc).__name__, str(exc), tb, fatal)


class WorkerProc(BusyLoopTarget):
    def __init__(self, launch: WorkerLaunch) -> None:
        self.launch = launch
        self.rank = launch.rank
        self.runner: ModelRunner | EncoderRunner | None = None  # built in init (it imports torch)
        self._reader: SyncReader | None = None
        self._writer: SyncWriter | None = None
        self._decoder = msgspec.msgpack.Decoder(WorkerInbound)
        self._encoder = msgspec.msgpack.Encoder()
        self._dist = False
        self._ctx: LoopContext | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def init(self, ctx: LoopContext) -> dict[str, Any]:
        import torch

        from aioengine.worker.loader import resolve_device
        from aioengine.worker.runner_factory import make_runner

        self._ctx = ctx
        la, cfg = self.launch, self.launch.config
        device = resolve_device(cfg.device)
        if device.type == "cuda":
            device = torch.device("cuda", self.rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        if la.world_size > 1:
            from aioengine.worker.parallel import init_distributed

            assert la.dist_init_addr is not None
            init_distributed(la.rank, la.world_size, la.dist_init_addr,
                             backend="nccl" if device.type == "cuda" else "gloo",
                             timeout_s=cfg.startup_timeout)
            self._dist = True
        self.runner = runner = make_runner(cfg, rank=la.rank, world_size=la.world_size,
                                           device=str(device))
        blocks = la.num_kv_blocks or self._agree_min(runner.plan_kv_blocks())
        runner.allocate_kv_cache(blocks)
        self._reader = open_broadcast_reader(la.step_url, la.rank,
                                             connect_timeout=la.connect_timeout)
        self._writer = open_writer(la.result_url, bind=False,
                                   connect_timeout=la.connect_timeout)
        reader = self._reader
        ctx.add_wakeup(reader.close)  # a blocked recv wakes with ChannelClosedError
        # The model and modules live as long as the process: keep them out of the collector's
        # scans, which otherwise stall steps and the interpreter's exit for seconds.
        gc.freeze()
        return {"rank": la.rank, "num_kv_blocks": blocks, "max_model_len": runner.max_model_len,
                "kv_window": runner.kv_window, "kv_bytes_per_block": runner.kv_bytes_per_block,
                "kv_sized_by": runner.kv_sized_by,
                "kv_dtype": str(runner.kv_dtype).removeprefix("torch."),
                "device": str(device), "dtype": str(runner.dtype).replace("torch.", "")}

    def _agree_min(self, blocks: int) -> int:
        """Every rank must allocate the same block count: the smallest any rank can hold."""
        if self.launch.world_size == 1:
            return blocks
        import torch
        import torch.distributed as dist

        assert self.runner is not None  # built just before, in init
        t = torch.tensor([blocks], dtype=torch.long, device=self.runner.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def step(self, ctx: LoopContext) -> None:
        reader = self._reader
        assert reader is not None
        try:
            frame = reader.recv(timeout=RECV_SLICE)
        except TimeoutError:
            return
        except ChannelClosedError:
            return  # closed by the shutdown wake-up
        except PeerClosedError:
            ctx.request_shutdown("the engine closed the step channel")
            return
        try:
            msg = self._decoder.decode(frame.header)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            logger.error("rank %d: malformed frame on the step channel (%d bytes): %s",
                         self.rank, len(frame.header), exc)
            if self.rank == 0:  # every rank got the same frame: one answer is enough
                self._send(error_reply(self.rank, exc, fatal=False))
            return
        try:
            reply = self._run(msg, ctx)
        except Exception as exc:
            self._send(error_reply(self.rank, exc, fatal=True))
            raise
        if reply is not None:
            self._send(reply)

    def _run(self, msg: StepInput | WorkerCall, ctx: LoopContext) -> WorkerOutbound | None:
        if isinstance(msg, StepInput):
            runner = self.runner
            assert runner is not None  # built by init
            out = runner.execute(msg)
            return out if self.rank == 0 else None
        call = CALLS.get(msg.method)
        if call is None:
            exc = ValueError(f"unknown worker call {msg.method!r}; known: {list(CALLS)}")
            return error_reply(self.rank, exc, fatal=False) if self.rank == 0 else None
        result = call(self, ctx)
        return WorkerCallResult(msg.call_id, result) if self.rank == 0 else None

    def _memory_report(self) -> dict[str, Any]:
        runner = self.runner
        assert runner is not None  # built by init
        prof = runner.memory_profile
        return {"num_kv_blocks": runner.num_kv_blocks, "max_model_len": runner.max_model_len,
                "block_size": runner.config.block_size,
                "free_bytes": prof.free_bytes if prof else None,
                "activation_peak_bytes": prof.activation_peak_bytes if prof else None,
                "bytes_per_block": prof.bytes_per_block if prof else None}

    def _send(self, reply: WorkerOutbound) -> None:
        writer = self._writer
        if writer is None:
            return
        try:
            writer.send(self._encoder.encode(reply))
        except PeerClosedError:
            logger.warning("rank %d: the engine closed the result channel; dropping %s",
                           self.rank, type(reply).__name__)
            if self._ctx is not None:
                self._ctx.request_shutdown("the engine closed the result channel")

    def cleanup(self) -> None:
        for endpoint in (self._reader, self._writer):
            if endpoint is not None:
                endpoint.close()
        if self.runner is not None:
            self.runner.release()
            self.runner = None
        if self._dist:
            from aioengine.worker.parallel import destroy_distributed

            destroy_distributed()


def _ping(proc: WorkerProc, ctx: LoopContext) -> object:
    return "pong"


def _shutdown(proc: WorkerProc, ctx: LoopContext) -> object:
    ctx.request_shutdown("shutdown call")
    return None


def _profile_memory(proc: WorkerProc, ctx: LoopContext) -> object:
    return proc._memory_report()


CALLS: dict[str, Callable[[WorkerProc, LoopContext], object]] = {
    "ping": _ping, "shutdown": _shutdown, "profile_memory": _profile_memory}
"""The calls a worker answers (``WorkerCall.method``), each with its result."""
