"""The executor contract: run one scheduled step on the model, wherever the model lives."""

from __future__ import annotations

import abc
from dataclasses import dataclass

from aioengine.messages.worker_io import StepInput, StepResult


@dataclass(frozen=True)
class ExecutorInfo:
    """What the engine learns from the model side once it is loaded."""

    num_kv_blocks: int
    """KV blocks every rank holds (the smallest over ranks)."""
    kv_bytes_per_block: int = 0
    """Bytes one KV block takes, summed over the ranks (0: not known)."""
    kv_sized_by: str = ""
    """What decided the block count (rank 0's words), for the log and ``engine_info``."""
    kv_dtype: str = ""
    """What a KV block stores (``float16``, ...)."""
    kv_window: int | None = None
    """Sliding window of every attention layer, when all have one: a sequence's KV blocks that
    fall wholly before it are never read again and are freed."""


class ExecutorError(RuntimeError):
    """The model side failed (a worker raised or died); the engine cannot go on."""


class Executor(abc.ABC):
    supports_lookahead: bool = False
    """True when steps may be queued with ``submit`` and their results taken with ``collect``,
    and chunks may carry ``PREVIOUS_TOKEN`` (one rank, in another process): the engine then
    schedules each step before the previous one's result is back, so the model never waits
    for the engine's round trip."""

    @property
    def computes_here_on_cpu(self) -> bool:
        """True when the model computes on the CPU in the calling thread (uniproc on CPU): the
        engine's Python threads then compete with it for the GIL."""
        return False

    def process_ids(self) -> dict[str, int]:
        """``{name: pid}`` of the processes the executor started (none for uniproc)."""
        return {}

    @abc.abstractmethod
    def start(self) -> ExecutorInfo:
        """Load the model, size and allocate the KV cache. Raises on any failure."""

    @abc.abstractmethod
    def execute(self, step: StepInput) -> StepResult:
        """Run one step; raises ``ExecutorError`` if the model side failed."""

    def submit(self, step: StepInput) -> None:
        """Queue one step (only where ``supports_lookahead``); results come from ``collect`` in
        submission order. Raises ``ExecutorError`` if the model side failed."""
        raise NotImplementedError(f"{type(self).__name__} does not queue steps")

    def collect(self, step: StepInput) -> StepResult:
        """The result of ``step``, the oldest submitted step not yet collected."""
        raise NotImplementedError(f"{type(self).__name__} does not queue steps")

    @abc.abstractmethod
    def check_health(self) -> None:
        """Raise ``ExecutorError`` if the model side is gone (called while the engine idles)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release the model and any worker processes. Idempotent."""
