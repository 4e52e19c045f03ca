"""The mp executor: one worker process per tensor-parallel rank, under a ``Supervisor``.

Channels (the engine binds all of them, so it owns their cleanup): one broadcast of
``WorkerInbound`` frames to every rank, and one result channel per rank. Rank 0 answers each
step with a ``StepResult``; any rank that fails answers with a ``WorkerError``. The engine waits
on rank 0 in short slices and between them looks at the other ranks and at deaths, so a rank
stuck in a collective behind a failed peer cannot hang the engine.

The engine process itself never imports torch here: the model lives in the workers.
"""

from __future__ import annotations

import logging
import socket
import threading

import msgspec

from aioengine.config import EngineConfig
from aioengine.engine.executor.base import Executor, ExecutorError, ExecutorInfo
from aioengine.messages.launch import WORKER_TARGET, WorkerLaunch
from aioengine.messages.worker_io import (
    StepInput,
    StepResult,
    WorkerCall,
    WorkerError,
    WorkerOutbound,
)
from aioengine.runtime import ChildSpec, Supervisor, describe_exitcode
from transports import (
    PeerClosedError,
    SyncReader,
    SyncWriter,
    TransportError,
    open_broadcast_writer,
    open_reader,
)

logger = logging.getLogger(__name__)

WAIT_SLICE = 0.05  # seconds between looks at the other ranks while waiting on rank 0
SEND_TIMEOUT = 60.0  # a step frame that cannot be written this long means the workers hang
# How long a closed result channel waits for its worker's exit to be reported. It ends at the
# report; a loaded machine may take seconds to reap, and only a worker that closed the channel
# without exiting (a bug) makes it wait the whole time.
DEATH_REPORT_WAIT = 10.0


def worker_name(rank: int) -> str:
    return f"aioengine-worker-tp{rank}"


def transport_name(transport: str) -> str:
    """The short transport name (``zmq``, ``shm``, ``uds``) of a config's transport or URL:
    worker channels get private default addresses of the same kind."""
    return transport.split("://", 1)[0].split("+", 1)[0]


def free_loopback_addr() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.world_size = config.tensor_parallel_size
        self._supervisor: Supervisor | None = None
        self._steps: SyncWriter | None = None
        self._results: list[SyncReader] = []
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(WorkerOutbound)
        self._dead: str | None = None  # set by the monitor thread when a worker dies
        self._death_seen = threading.Event()  # set with ``_dead``
        self._lock = threading.Lock()
        self._closed = False
        # Only the driver rank samples, so only one rank knows a PREVIOUS_TOKEN's value.
        self.supports_lookahead = self.world_size == 1

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> ExecutorInfo:
        cfg, n = self.config, self.world_size
        kind = transport_name(cfg.transport)
        try:
            self._steps = open_broadcast_writer(kind, n)
            self._results = [open_reader(kind, bind=True) for _ in range(n)]
            dist_addr = (cfg.dist_init_addr or free_loopback_addr()) if n > 1 else None
            specs = [ChildSpec(worker_name(r), WORKER_TARGET, WorkerLaunch(
                cfg, r, n, self._steps.address, self._results[r].address, dist_addr,
                cfg.num_kv_blocks).encode()) for r in range(n)]
            self._supervisor = Supervisor(self._on_death)
            ready = self._supervisor.start(specs, cfg.startup_timeout)
        except BaseException:
            self.shutdown()
            raise
        blocks = {ready[worker_name(r)]["num_kv_blocks"] for r in range(n)}
        if len(blocks) != 1:
            self.shutdown()
            raise ExecutorError(f"workers disagree on the KV block count: {sorted(blocks)}")
        first = ready[worker_name(0)]
        return ExecutorInfo(num_kv_blocks=blocks.pop(), kv_window=first.get("kv_window"),
                            kv_bytes_per_block=sum(ready[worker_name(r)].get(
                                "kv_bytes_per_block", 0) for r in range(n)),
                            kv_sized_by=first.get("kv_sized_by", ""),
                            kv_dtype=first.get("kv_dtype", ""))

    def process_ids(self) -> dict[str, int]:
        sup = self._supervisor
        return {} if sup is None else {name: sup.pid(name) for name in sup.names}

    def _on_death(self, name: str, exitcode: int | None) -> None:
        self._dead = f"worker {name} died ({describe_exitcode(exitcode)})"
        self._death_seen.set()
        logger.error(self._dead)

    def check_health(self) -> None:
        if self._dead is not None:
            raise ExecutorError(self._dead)

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        steps = self._steps
        if steps is not None and self._supervisor is not None and self._dead is None:
            try:  # ask politely first; the supervisor's SIGTERM follows anyway
                steps.send(self._encoder.encode(WorkerCall(0, "shutdown")), timeout=1.0)
            except (TransportError, TimeoutError) as exc:
                logger.debug("shutdown call not delivered: %s", exc)
        if self._supervisor is not None:
            self._supervisor.shutdown()
        for endpoint in (steps, *self._results):
            if endpoint is not None:
                endpoint.close()

    # ---- stepping --------------------------------------------------------------------------
    def execute(self, step: StepInput) -> StepResult:
        self.submit(step)
        return self.collect(step)

    def submit(self, step: StepInput) -> None:
        self.check_health()
        steps = self._steps
        if steps is None or self._closed:
            raise ExecutorError("the mp executor is not started (or already shut down)")
        try:
            steps.send(self._encoder.encode(step), timeout=SEND_TIMEOUT)
        except (TransportError, TimeoutError) as exc:
            raise ExecutorError(f"could not send step {step.step_id} to the workers: "
                                f"{type(exc).__name__}: {exc}") from exc

    def collect(self, step: StepInput) -> StepResult:
        reply = self._wait_rank0()
        if not isinstance(reply, StepResult) or reply.step_id != step.step_id:
            raise ExecutorError(f"rank 0 answered step {step.step_id} with {reply!r}")
        return reply

    def _wait_rank0(self) -> WorkerOutbound:
        while True:
            reply = self._recv(0, WAIT_SLICE)
            if reply is not None:
                return reply
            for rank in range(1, self.world_size):
                self._recv(rank, 0.0)  # only errors come from here
            self.check_health()

    def _recv(self, rank: int, timeout: float) -> WorkerOutbound | None:
        try:
            frame = self._results[rank].recv(timeout=timeout)
        except TimeoutError:
            return None
        except PeerClosedError as exc:
            # A worker closes its result channel as it exits: wait for the monitor to report
            # the exit, so the error names its cause (exit code, signal).
            self._death_seen.wait(DEATH_REPORT_WAIT)
            self.check_health()
            raise ExecutorError(f"worker rank {rank} closed its result channel") from exc
        except TransportError as exc:
            raise ExecutorError(f"result channel of rank {rank} failed: {exc}") from exc
        try:
            reply = self._decoder.decode(frame.header)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ExecutorError(f"malformed reply from worker rank {rank}: {exc}") from exc
        if isinstance(reply, WorkerError):
            raise ExecutorError(f"worker rank {reply.rank} failed: {reply.exc_type}: "
                                f"{reply.message}\n{reply.traceback}")
        if rank != 0:
            raise ExecutorError(f"worker rank {rank} sent an unexpected {type(reply).__name__}")
        return reply
