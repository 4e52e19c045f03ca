"""The uniproc executor: the ModelRunner lives in the engine process (one rank, no IPC)."""

from __future__ import annotations

import logging

from aioengine.config import EngineConfig
from aioengine.engine.executor.base import Executor, ExecutorError, ExecutorInfo
from aioengine.messages.worker_io import StepInput, StepResult

logger = logging.getLogger(__name__)


class UniprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        if config.tensor_parallel_size != 1:
            raise ValueError("the uniproc executor runs one rank; tensor_parallel_size="
                             f"{config.tensor_parallel_size} needs executor 'mp'")
        self.config = config
        self.runner = None

    def start(self) -> ExecutorInfo:
        from aioengine.worker.runner_factory import make_runner  # torch, only in the engine

        self.runner = make_runner(self.config, rank=0, world_size=1)
        blocks = self.runner.plan_kv_blocks()
        self.runner.allocate_kv_cache(blocks)
        return ExecutorInfo(num_kv_blocks=blocks, kv_window=self.runner.kv_window,
                            kv_bytes_per_block=self.runner.kv_bytes_per_block,
                            kv_sized_by=self.runner.kv_sized_by,
                            kv_dtype=str(self.runner.kv_dtype).removeprefix("torch."))

    @property
    def computes_here_on_cpu(self) -> bool:
        return self.runner is not None and self.runner.device.type == "cpu"

    def execute(self, step: StepInput) -> StepResult:
        if self.runner is None:
            raise ExecutorError("the uniproc executor is not started (or already shut down)")
        try:
            return self.runner.execute(step)
        except Exception as exc:
            raise ExecutorError(f"model runner failed in step {step.step_id}: "
                                f"{type(exc).__name__}: {exc}") from exc

    def check_health(self) -> None:
        """The runner shares this process: it cannot die on its own."""

    def shutdown(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.release()
