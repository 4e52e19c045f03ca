"""Continuous-batching scheduler with chunked prefill, prefix caching and preemption.

One step: running decodes first (one token each), then running prefills continue in chunks
with the remaining token budget, then waiting requests are admitted (strict priority, FCFS
within a priority). When a running request cannot get a block, the lowest-priority, newest
request not yet scheduled this step is preempted: its blocks are freed and it waits again to be
recomputed from its prompt and the tokens it already produced, so its output does not change.
"""

from __future__ import annotations

import bisect
import logging
import time

from aioengine.engine.block_manager import BlockManager
from aioengine.engine.request import FinishReason, Request, RequestStatus
from aioengine.engine.stop_checker import check_stop
from aioengine.messages.engine_io import RequestDelta
from aioengine.messages.worker_io import (
    PREVIOUS_TOKEN,
    NewSequence,
    PooledOutput,
    ScheduledChunk,
    StepInput,
    StepResult,
)

logger = logging.getLogger(__name__)


def _key(req: Request) -> tuple[int, int]:
    return req.sort_key


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 enable_chunked_prefill: bool = True, kv_window: int | None = None) -> None:
        self.bm = block_manager
        self.kv_window = kv_window  # every layer's sliding window: free blocks before it
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.requests: dict[str, Request] = {}  # unfinished only
        self.waiting: list[Request] = []  # sorted by (priority, seq)
        self.running: list[Request] = []  # sorted by (priority, seq)
        self._finished_ids: list[str] = []  # workers drop these at the next step
        self._next_seq = 0
        self._next_step = 0
        self.num_preempted_total = 0
        self.num_finished_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    # ---- requests in and out ---------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in the engine")
        req.seq = self._next_seq
        self._next_seq += 1
        self.requests[req.request_id] = req
        bisect.insort(self.waiting, req, key=_key)

    def abort(self, request_ids: list[str]) -> list[Request]:
        """Finish the given requests with ``abort`` and free their blocks at once. Unknown or
        already finished ids are ignored. Returns the requests aborted."""
        aborted = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            if req.status is RequestStatus.RUNNING:
                self.running.remove(req)
                self._finished_ids.append(rid)
            else:
                self.waiting.remove(req)
            self._finish(req, FinishReason.ABORT)
            aborted.append(req)
        return aborted

    def _finish(self, req: Request, reason: FinishReason | None = None) -> None:
        if reason is not None:
            req.finish(reason)
        self.bm.free(req)
        del self.requests[req.request_id]
        self.num_finished_total += 1

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # ---- scheduling ------------------------------------------------------------------------
    def schedule(self) -> StepInput:
        """Pick this step's work. The caller runs it and hands the result to ``update``."""
        budget = self.max_num_batched_tokens
        scheduled: set[str] = set()
        chunks: list[ScheduledChunk] = []
        new_seqs: list[NewSequence] = []
        preempted_before = self.num_preempted_total

        def emit(req: Request, n: int) -> None:
            nonlocal budget
            start = req.num_computed_tokens
            last = start + n == req.num_tokens
            chunks.append(ScheduledChunk(req.request_id, req.token_ids[start:start + n], start,
                                         list(req.block_ids), last and not req.pooling,
                                         req.pooling, req.pair_start))
            scheduled.add(req.request_id)
            budget -= n

        # Running requests: decodes, then prefills still in progress.
        for decodes in (True, False):
            for req in list(self.running):
                if budget <= 0:
                    break
                if req.request_id in scheduled or req.status is not RequestStatus.RUNNING:
                    continue
                remaining = req.num_tokens - req.num_computed_tokens
                if (remaining == 1) != decodes:
                    continue
                n = min(remaining, budget)
                if n < remaining and not self.enable_chunked_prefill \
                        and remaining <= self.max_num_batched_tokens:
                    break  # waits for a step with room for all of it
                n = self._make_room(req, n, scheduled, shrink=not decodes)
                if n:
                    emit(req, n)

        # Waiting requests, unless this step had to preempt (they would take the blocks back).
        while self.waiting and self.num_preempted_total == preempted_before and budget > 0 \
                and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            # A pooling input runs whole (an encoder attends both ways), outside the cache.
            cached = [] if req.pooling else self.bm.find_cached_prefix(req)
            remaining = req.num_tokens - len(cached) * self.bm.block_size
            if remaining <= budget:
                n = remaining
            elif req.pooling:
                break  # waits for a step with room for all of it (the engine checked it fits)
            elif self.enable_chunked_prefill or remaining > self.max_num_batched_tokens:
                n = budget
            else:
                break
            if not self.bm.allocate(req, n, cached):
                break
            self.waiting.pop(0)
            bisect.insort(self.running, req, key=_key)
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.time()
                self.prompt_tokens_total += req.num_prompt_tokens
            req.status = RequestStatus.RUNNING
            new_seqs.append(NewSequence(req.request_id, req.prompt_token_ids,
                                        req.output_token_ids, req.params,
                                        list(req.eos_token_ids)))
            emit(req, n)

        finished, self._finished_ids = self._finished_ids, []
        self._next_step += 1
        return StepInput(self._next_step, new_seqs, chunks, finished)

    def schedule_ahead(self, inflight: StepInput) -> StepInput | None:
        """The next step, picked before ``inflight``'s result is back: one ``[PREVIOUS_TOKEN]``
        decode for every running request, each right after its chunk in ``inflight``. Only the
        plain case: nothing waits, every running request samples in ``inflight`` and may take
        one more token after that one (``max_tokens``, ``max_model_len``), and blocks come
        without preemption. Otherwise None: collect ``inflight`` first, then ``schedule``.

        ``update`` must see ``inflight`` before this step. A request that stops (eos, a stop
        token) in ``inflight`` has its token from this step dropped there; its blocks are freed
        at once, which is safe because the model runs steps in order."""
        running = self.running
        if self.waiting or not running or len(running) > self.max_num_batched_tokens:
            return None
        if any(req.grammar is not None for req in running):
            return None  # its bitmask needs the token still in flight
        sampled = {c.request_id: c for c in inflight.chunks if c.sample}
        if len(sampled) < len(running):
            return None
        starts = []
        for req in running:
            chunk = sampled.get(req.request_id)
            if chunk is None or req.num_output_tokens + 1 >= req.params.max_tokens \
                    or req.num_tokens + 1 >= self.max_model_len:
                return None
            starts.append(chunk.start_pos + len(chunk.token_ids))
        for req, start in zip(running, starts, strict=True):
            if not self.bm.allocate(req, start + 1 - req.num_computed_tokens):
                return None  # blocks taken so far are the ones the next steps need anyway
        chunks = [ScheduledChunk(req.request_id, [PREVIOUS_TOKEN], start, list(req.block_ids),
                                 True) for req, start in zip(running, starts, strict=True)]
        finished, self._finished_ids = self._finished_ids, []
        self._next_step += 1
        return StepInput(self._next_step, [], chunks, finished)

    def requeue_finished(self, step: StepInput) -> None:
        """A step with no chunks is not run: keep its ``finished_ids`` for the next one."""
        self._finished_ids[:0] = step.finished_ids

    def _room(self, req: Request) -> int:
        """Tokens ``req`` could still add with the blocks it holds plus every free block."""
        return (len(req.block_ids) + self.bm.num_free_blocks) * self.bm.block_size \
            - req.num_computed_tokens

    def _make_room(self, req: Request, n: int, scheduled: set[str], *, shrink: bool) -> int:
        """Allocate blocks for ``n`` tokens of running ``req`` (or, with ``shrink``, for as many
        as fit, at least one), preempting the lowest-priority, newest request not scheduled this
        step while none fit. Returns the tokens allocated: 0 when ``req`` itself was the victim."""
        while True:
            if shrink and self.enable_chunked_prefill:
                n = min(n, max(1, self._room(req)))
            if self.bm.allocate(req, n):
                return n
            victim = next(r for r in reversed(self.running) if r.request_id not in scheduled)
            self._preempt(victim)
            if victim is req:
                return 0

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.bm.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preempted_total += 1
        self._finished_ids.append(req.request_id)
        bisect.insort(self.waiting, req, key=_key)
        logger.debug("preempted %s (priority %d) after %d output tokens", req.request_id,
                     req.priority, req.num_output_tokens)

    # ---- results ---------------------------------------------------------------------------
    def update(self, step: StepInput, result: StepResult) -> list[RequestDelta]:
        """Advance every scheduled request by its chunk, append sampled tokens, apply stops."""
        if result.step_id != step.step_id:
            raise RuntimeError(f"executor answered step {result.step_id} to step {step.step_id}")
        expected = [c.request_id for c in step.chunks if c.sample]
        got = [s.request_id for s in result.sampled]
        if got != expected:
            raise RuntimeError(f"step {step.step_id}: executor sampled for {got}, expected one "
                               f"token for each of {expected}")
        pooled = [c.request_id for c in step.chunks if c.pool]
        if [p.request_id for p in result.pooled] != pooled:
            raise RuntimeError(f"step {step.step_id}: executor pooled for "
                               f"{[p.request_id for p in result.pooled]}, expected {pooled}")
        for chunk in step.chunks:
            req = self.requests.get(chunk.request_id)
            if req is not None and req.status is RequestStatus.RUNNING:
                req.num_computed_tokens += len(chunk.token_ids)
                if not req.pooling:
                    self.bm.cache_computed_blocks(req)
                if self.kv_window is not None:
                    self.bm.release_before_window(req, self.kv_window)
        deltas = [d for p in result.pooled if (d := self._pooled(p)) is not None]
        now = time.time()
        for s in result.sampled:
            req = self.requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            req.token_ids.append(s.token_id)
            self.generation_tokens_total += 1
            if req.first_token_time is None:
                req.first_token_time = now
            # The grammar first: a token that completes the output ends it with "stop" even
            # when it is also the last one max_tokens allows.
            stopped = req.grammar is not None and _advance_grammar(req, s.token_id)
            stopped = stopped or check_stop(req, s.token_id, self.max_model_len)
            if stopped:
                self.running.remove(req)
                self._finished_ids.append(req.request_id)
                self._finish(req)
            deltas.append(self.make_delta(req, [s.token_id],
                                          None if s.logprob is None else [s.logprob]))
        return deltas

    def _pooled(self, out: PooledOutput) -> RequestDelta | None:
        """Finish a pooling request with its vector."""
        req = self.requests.get(out.request_id)
        if req is None or req.status is not RequestStatus.RUNNING:
            return None  # aborted while its step ran
        self.running.remove(req)
        self._finished_ids.append(req.request_id)
        self._finish(req, FinishReason.STOP)
        delta = self.make_delta(req, [])
        delta.embedding = out.embedding
        return delta

    @staticmethod
    def make_delta(req: Request, new_token_ids: list[int], logprobs=None) -> RequestDelta:
        delta = RequestDelta(
            req.request_id, new_token_ids, new_logprobs=logprobs,
            finish_reason=None if req.finish_reason is None else req.finish_reason.value,
            stop_token_id=req.stop_token_id, error=req.error)
        if not req.reported_first:
            req.reported_first = True
            delta.num_cached_tokens = req.num_cached_tokens
            delta.first_scheduled_time = req.first_scheduled_time
        return delta


def _advance_grammar(req: Request, token_id: int) -> bool:
    """Feed the sampled token to the request's grammar; finish the request when the grammar
    is complete (its end accepted: eos, even under ``ignore_eos`` or before ``min_tokens``) or
    refuses the token (only if the bitmask was not applied: an engine bug, reported)."""
    grammar = req.grammar
    assert grammar is not None
    if not grammar.accept(token_id):
        req.finish(FinishReason.ERROR, error=f"structured outputs: token {token_id} is not "
                   f"allowed by the grammar ({grammar.error})")
        return True
    if grammar.is_terminated:
        req.finish(FinishReason.STOP)
        return True
    return False
