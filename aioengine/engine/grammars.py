"""The engine's side of structured outputs: compile grammars off the step loop, keep one
matcher per constrained request, and build each step's token bitmask.

Grammars compile in a small thread pool (llguidance drops the GIL while it compiles), cached by
the constraint's key, so the step loop never waits for one: a request whose grammar is not
ready yet waits outside the scheduler (``EngineCore``) while the batch goes on. The matchers
live here in the engine process, not in the workers: one set whatever the tensor-parallel size
and executor, advanced by ``Scheduler.update`` with each sampled token. A preempted request
keeps its matcher (its tokens are recomputed, not re-sampled), so recompute and prefix-cache
hits need nothing from it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from aioengine.messages.sampling_params import StructuredOutputs
from aioengine.messages.worker_io import GrammarBitmask
from aioengine.structured import (
    CompiledGrammar,
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    spec_key,
)

logger = logging.getLogger(__name__)

CACHE_SIZE = 512  # compiled grammars kept (each a matcher at its start state: a few KB)
COMPILE_THREADS = 2


class GrammarManager:
    def __init__(self, tokenizer_path: str, vocab_size: int,
                 eos_token_ids: Sequence[int]) -> None:
        """Nothing is built until the first constrained request: the tokenizer's grammar tables
        (slow to build for a large vocabulary) load in the pool on first use."""
        self._tokenizer_path = tokenizer_path
        self._vocab_size = vocab_size
        self._eos = tuple(eos_token_ids)
        self._pool: ThreadPoolExecutor | None = None
        self._backend: GrammarBackend | None = None
        self._backend_lock = threading.Lock()
        self._cache: OrderedDict[str, Future[CompiledGrammar]] = OrderedDict()
        self.compiles = 0  # cache misses, for stats and tests

    def compile(self, spec: StructuredOutputs) -> Future[CompiledGrammar]:
        """The compiled grammar for ``spec`` (cached; a failed compile is cached too, so the
        same bad schema is refused at once)."""
        key = spec_key(spec)
        future = self._cache.get(key)
        if future is not None:
            self._cache.move_to_end(key)
            return future
        if self._pool is None:
            self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar")
        future = self._pool.submit(self._compile, spec)
        self.compiles += 1
        self._cache[key] = future
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return future

    def _compile(self, spec: StructuredOutputs) -> CompiledGrammar:
        return self.backend.compile(spec)

    @property
    def backend(self) -> GrammarBackend:
        with self._backend_lock:
            if self._backend is None:
                self._backend = GrammarBackend(self._tokenizer_path, self._vocab_size, self._eos)
            return self._backend

    def matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        return self.backend.matcher(compiled)

    def bitmask(self, rows: list[int], matchers: list[GrammarMatcher]) -> GrammarBitmask:
        backend = self.backend
        out = np.empty((len(rows), backend.words), dtype=np.int32)
        backend.fill_bitmask(matchers, out)
        return GrammarBitmask(rows, backend.words, out.tobytes())

    def shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def compile_error(future: Future[CompiledGrammar]) -> str | None:
    """The message of a failed compile (None if it succeeded). ``future`` must be done."""
    exc = future.exception()
    if exc is None:
        return None
    if isinstance(exc, GrammarError):
        return str(exc)
    logger.error("grammar compile failed unexpectedly", exc_info=exc)
    return f"structured_outputs could not be compiled: {type(exc).__name__}: {exc}"
