"""Drives real worker processes directly over a transport, as an mp executor would: a
broadcast writer for steps, one result reader per rank, a Supervisor for the processes."""

from __future__ import annotations

import threading
import time

import msgspec

from aioengine.config import EngineConfig
from aioengine.messages.launch import WORKER_TARGET as TARGET
from aioengine.messages.launch import WorkerLaunch
from aioengine.messages.worker_io import (
    StepInput,
    StepResult,
    WorkerCall,
    WorkerCallResult,
    WorkerError,
    WorkerInbound,
    WorkerOutbound,
)
from aioengine.runtime import ChildSpec, Supervisor
from aioengine.worker.parallel.distributed import default_init_addr
from transports import PeerClosedError, open_broadcast_writer, open_reader

REPLY_TIMEOUT = 120.0  # generous: a loaded 2-core box


class WorkerFailed(RuntimeError):
    def __init__(self, error: WorkerError) -> None:
        super().__init__(f"rank {error.rank}: {error.exc_type}: {error.message}")
        self.error = error


class WorkerDied(RuntimeError):
    pass


class WorkerHarness:
    def __init__(self, config: EngineConfig, transport: str = "shm",
                 num_kv_blocks: int | None = None, startup_timeout: float = 240.0) -> None:
        world = config.tensor_parallel_size
        self.world = world
        self.deaths: list[tuple[str, int | None]] = []
        self.died = threading.Event()
        # A generous grace: a bound on a wait, which ends as soon as the workers are gone. On a
        # loaded box a graceful stop (gloo teardown, freeing the model) can outlast 5 s, and a
        # SIGKILL after the grace would read as an unclean exit to the tests that check one.
        self.sup = Supervisor(on_death=self._on_death, shutdown_grace=60.0)
        self.steps = open_broadcast_writer(transport, world)
        self.results = [open_reader(transport, bind=True) for _ in range(world)]
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(WorkerOutbound)
        dist_addr = default_init_addr() if world > 1 else None
        specs = [ChildSpec(f"aioengine-worker-tp{rank}", TARGET, WorkerLaunch(
            config, rank, world, self.steps.address, self.results[rank].address, dist_addr,
            num_kv_blocks).encode()) for rank in range(world)]
        try:
            self.ready = self.sup.start(specs, startup_timeout)
        except BaseException:
            self.close()
            raise
        self._call_id = 0
        self.gone: set[int] = set()  # ranks whose result channel closed

    def _on_death(self, name: str, exitcode: int | None) -> None:
        self.deaths.append((name, exitcode))
        self.died.set()

    def send(self, msg: WorkerInbound | bytes) -> None:
        frame = msg if isinstance(msg, bytes) else self._enc.encode(msg)
        self.steps.send(frame, timeout=REPLY_TIMEOUT)

    def reply(self, timeout: float = REPLY_TIMEOUT) -> WorkerOutbound:
        """Rank 0's next reply; any rank's error or any death raises."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rank in range(1, self.world):
                if rank in self.gone:
                    continue
                try:
                    msg = self._dec.decode(self.results[rank].recv(timeout=0.001).header)
                except TimeoutError:
                    continue
                except PeerClosedError:
                    self.gone.add(rank)  # its death is reported by the supervisor
                    continue
                assert isinstance(msg, WorkerError), f"rank {rank} answered {msg!r}"
                raise WorkerFailed(msg)
            try:
                msg = self._dec.decode(self.results[0].recv(timeout=0.05).header)
            except PeerClosedError:
                raise WorkerDied(f"rank 0 closed its result channel; deaths: {self.deaths}") \
                    from None
            except TimeoutError:
                if any(name.endswith("tp0") for name, _ in self.deaths):
                    raise WorkerDied(f"rank 0 died: {self.deaths}") from None
                continue
            if isinstance(msg, WorkerError):
                raise WorkerFailed(msg)
            return msg
        raise TimeoutError(f"no reply within {timeout} s")

    def execute(self, step: StepInput) -> StepResult:
        self.send(step)
        result = self.reply()
        assert isinstance(result, StepResult) and result.step_id == step.step_id, result
        return result

    def call(self, method: str, *args: object) -> object:
        self._call_id += 1
        self.send(WorkerCall(self._call_id, method, list(args)))
        result = self.reply()
        assert isinstance(result, WorkerCallResult) and result.call_id == self._call_id
        return result.result

    def close(self) -> None:
        self.sup.shutdown()
        for endpoint in (self.steps, *self.results):
            endpoint.close()
