"""Executors run scheduled steps on the model: ``uniproc`` (in the engine process) or ``mp``
(one worker process per tensor-parallel rank). ``EngineConfig.resolved_executor`` picks one:
``auto`` is uniproc for one rank and mp for tensor parallelism.

Why uniproc for one rank: it saves a process, a model-sized address space and a serialized
round trip per step. Measured, the per-step IPC cost of mp (msgpack frames of a few hundred
bytes) was below the run-to-run noise of both executors on every transport, and no case
favoured mp (docs/benchmarks.md)."""

from __future__ import annotations

from aioengine.config import EngineConfig
from aioengine.engine.executor.base import Executor, ExecutorError, ExecutorInfo


def make_executor(config: EngineConfig) -> Executor:
    kind = config.resolved_executor
    if kind == "uniproc":
        from aioengine.engine.executor.uniproc import UniprocExecutor

        return UniprocExecutor(config)
    if kind == "mp":
        from aioengine.engine.executor.mp import MultiprocExecutor

        return MultiprocExecutor(config)
    raise ValueError(f"unknown executor {kind!r}; expected 'uniproc' or 'mp'")


__all__ = ["Executor", "ExecutorError", "ExecutorInfo", "make_executor"]
