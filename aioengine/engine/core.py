"""EngineCore: requests in, one model step at a time, per-request deltas out.

Synchronous and single-threaded: the engine process (``core_proc``) feeds it from queues, and
tests or an in-process embedding can drive it directly. Bad input never raises out of
``add_request``: the request gets a finishing delta with ``finish_reason="error"`` instead.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import FIRST_COMPLETED, Future, wait

from aioengine.config import EngineConfig
from aioengine.engine.block_manager import BlockManager
from aioengine.engine.executor.base import Executor
from aioengine.engine.grammars import GrammarManager, compile_error
from aioengine.engine.request import FinishReason, Request
from aioengine.engine.scheduler import Scheduler
from aioengine.hub import ModelInfo, read_model_info, resolve_model
from aioengine.messages.engine_io import AddRequest, EngineStats, RequestDelta
from aioengine.messages.worker_io import StepInput
from aioengine.runtime.process_tree import resident_memory
from aioengine.text.detokenize import EngineDetokenizer

logger = logging.getLogger(__name__)

GRAMMAR_WAIT = 0.005  # seconds an otherwise idle step waits for a grammar being compiled


TASK_NAMES = {"embed": "embedding", "score": "reranking"}
TASK_ROUTES = {"embed": "embedding requests (embed, /v1/embeddings)",
               "score": "scoring requests (score, rerank, /v1/rerank, /score)"}


def resolve_max_model_len(config: EngineConfig, model_len: int, num_kv_blocks: int) -> int:
    """The context length the engine enforces: the configured one (checked against the model
    and the KV cache), or the model's, cut to what the KV cache can hold."""
    capacity = num_kv_blocks * config.block_size
    if config.max_model_len is not None:
        if config.max_model_len > model_len:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's context "
                             f"length {model_len} (max_position_embeddings)")
        if config.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {config.max_model_len} does not fit the KV cache: "
                f"{num_kv_blocks} blocks x {config.block_size} tokens = {capacity} tokens; "
                "give more KV memory or blocks, or a smaller max_model_len")
        return config.max_model_len
    if capacity < model_len:
        logger.warning("KV cache holds %d tokens (%d blocks), less than the model's context "
                       "length %d: limiting max_model_len to %d", capacity, num_kv_blocks,
                       model_len, capacity)
    return min(model_len, capacity)


class EngineCore:
    def __init__(self, config: EngineConfig, executor: Executor | None = None, *,
                 model_info: ModelInfo | None = None) -> None:
        """Start ``executor`` (by default the one ``config.resolved_executor`` names) and build
        the scheduler around the KV capacity it reports."""
        self.config = config
        resolved = resolve_model(config.model, config.tokenizer)
        self.model_info = model_info or read_model_info(resolved.model_path,
                                                        resolved.tokenizer_path)
        if executor is None:
            from aioengine.engine.executor import make_executor  # imports torch lazily

            executor = make_executor(config)
        self.executor = executor
        try:
            info = executor.start()
            self.max_model_len = resolve_max_model_len(
                config, self.model_info.max_position_embeddings, info.num_kv_blocks)
            if not config.enable_chunked_prefill and \
                    self.max_model_len > config.max_num_batched_tokens:
                raise ValueError(
                    f"without chunked prefill, max_num_batched_tokens "
                    f"({config.max_num_batched_tokens}) must be at least max_model_len "
                    f"({self.max_model_len})")
        except BaseException:
            executor.shutdown()
            raise
        self.kv_bytes_per_block = info.kv_bytes_per_block
        self.kv_sized_by = info.kv_sized_by
        self.kv_dtype = info.kv_dtype
        self.block_manager = BlockManager(info.num_kv_blocks, config.block_size,
                                          enable_prefix_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_model_len=self.max_model_len,
                                   enable_chunked_prefill=config.enable_chunked_prefill,
                                   kv_window=info.kv_window)
        self.detokenizer = (EngineDetokenizer.from_path(resolved.tokenizer_path)
                            if config.detokenize_in == "engine" else None)
        self.grammars = GrammarManager(resolved.tokenizer_path, self.model_info.vocab_size,
                                       self.model_info.eos_token_ids)
        # Constrained requests whose grammar is still compiling, in arrival order.
        self._compiling: list[tuple[AddRequest, Request, Future]] = []
        self._constrained: set[str] = set()  # ids of constrained requests in the scheduler
        self._pending: list[RequestDelta] = []  # errors and aborts, sent with the next step
        # With a lookahead executor: the step submitted and not yet collected (see _step_ahead).
        self._inflight: StepInput | None = None

    @property
    def eos_token_id(self) -> int | None:
        ids = self.model_info.eos_token_ids
        return ids[0] if ids else None

    @property
    def ready_payload(self) -> dict[str, int | str | None]:
        return {"num_kv_blocks": self.block_manager.num_blocks,
                "kv_bytes_per_block": self.kv_bytes_per_block, "kv_sized_by": self.kv_sized_by,
                "kv_dtype": self.kv_dtype,
                "max_model_len": self.max_model_len, "block_size": self.config.block_size,
                "eos_token_id": self.eos_token_id, "vocab_size": self.model_info.vocab_size,
                "task": self.model_info.task}

    # ---- requests --------------------------------------------------------------------------
    def _check(self, msg: AddRequest) -> str | None:
        n, limit = len(msg.prompt_token_ids), self.max_model_len
        if n == 0:
            return "the prompt is empty: a request needs at least one prompt token"
        if n > limit:
            return (f"the prompt has {n} tokens, more than max_model_len={limit} (the context "
                    "length this engine serves)")
        vocab = self.model_info.vocab_size
        bad = next((t for t in msg.prompt_token_ids
                    if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            return f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})"
        eos = msg.eos_token_id
        if eos is not None and not 0 <= eos < vocab:
            return f"eos_token_id {eos} is outside the vocabulary [0, {vocab})"
        if msg.request_id in self.scheduler.requests:
            return f"request id {msg.request_id!r} is already in the engine"
        return self._check_task(msg)

    def _check_task(self, msg: AddRequest) -> str | None:
        """An embedding or reranking model answers only pooling requests, and the reverse; a
        pooling input runs whole in one step; only a reranker takes text pairs."""
        task = self.model_info.task
        if task == "generate" and not msg.pooling and not msg.pair_start:
            return None  # a generation request to a generation model: the usual case
        name = ", ".join(self.model_info.architectures) or "this model"
        if task != "generate" and not msg.pooling:
            return (f"the model ({name}) is an {TASK_NAMES[task]} model: it answers "
                    f"{TASK_ROUTES[task]}, not text generation")
        if msg.pooling and task == "generate":
            return (f"the model ({name}) generates text: it has no pooling for embedding or "
                    "rerank requests")
        n, limit = len(msg.prompt_token_ids), self.config.max_num_batched_tokens
        if msg.pair_start and (task != "score" or not 0 < msg.pair_start < n):
            return (f"pair_start {msg.pair_start} must be inside the input (1 to {n - 1}) and "
                    "the model a reranker")
        if msg.pooling and n > limit:
            return (f"the input has {n} tokens, more than max_num_batched_tokens={limit} (an "
                    "embedding input runs whole in one step)")
        return None

    def add_request(self, msg: AddRequest) -> None:
        error = self._check(msg)
        if error is not None:
            logger.info("rejected request %s: %s", msg.request_id, error)
            self.reject(msg.request_id, error)
            return
        eos = (msg.eos_token_id,) if msg.eos_token_id is not None \
            else tuple(self.model_info.eos_token_ids)
        req = Request(msg.request_id, list(msg.prompt_token_ids), msg.params, msg.arrival_time,
                      msg.priority, eos, pooling=msg.pooling, pair_start=msg.pair_start)
        spec = msg.params.structured_outputs
        if spec is None:
            self._admit(msg, req)
            return
        if any(m.request_id == msg.request_id for m, _, _ in self._compiling):
            self.reject(msg.request_id, f"request id {msg.request_id!r} is already in the "
                                        "engine")
            return
        future = self.grammars.compile(spec)
        if future.done():
            self._admit_constrained(msg, req, future)
        else:
            self._compiling.append((msg, req, future))

    def _admit(self, msg: AddRequest, req: Request) -> None:
        if self.detokenizer is not None:
            self.detokenizer.add(msg)
        self.scheduler.add_request(req)

    def _admit_constrained(self, msg: AddRequest, req: Request, future: Future) -> None:
        error = compile_error(future)
        if error is not None:
            logger.info("rejected request %s: %s", msg.request_id, error)
            self.reject(msg.request_id, error)
            return
        req.grammar = self.grammars.matcher(future.result())
        self._constrained.add(req.request_id)
        self._admit(msg, req)

    def _admit_compiled(self) -> None:
        """Move the requests whose grammar is ready into the scheduler, in arrival order;
        when nothing else can run, wait a little for one (not a busy spin)."""
        if not self.scheduler.has_unfinished and self._inflight is None:
            wait([f for _, _, f in self._compiling], timeout=GRAMMAR_WAIT,
                 return_when=FIRST_COMPLETED)
        still = []
        for item in self._compiling:
            if item[2].done():
                self._admit_constrained(*item)
            else:
                still.append(item)
        self._compiling = still

    def reject(self, request_id: str, error: str) -> None:
        """Answer a request that never made it in (e.g. its frame failed validation)."""
        self._pending.append(RequestDelta(request_id, [], finish_reason="error", error=error))

    def abort(self, request_ids: list[str]) -> None:
        """Idempotent; frees blocks at once; unknown ids are ignored. Each request aborted here
        gets a finishing ``abort`` delta with the next step."""
        for req in self.scheduler.abort(request_ids):
            self._pending.append(self.scheduler.make_delta(req, []))
        if self._compiling:
            ids = set(request_ids)
            for _, req, _ in [c for c in self._compiling if c[1].request_id in ids]:
                req.finish(FinishReason.ABORT)
                self._pending.append(self.scheduler.make_delta(req, []))
            self._compiling = [c for c in self._compiling if c[1].request_id not in ids]

    def fail_all(self, message: str) -> list[RequestDelta]:
        """Finish every request with ``error`` (the model side is gone); returns the deltas."""
        deltas, self._pending = self._pending, []
        self._inflight = None
        compiling, self._compiling = self._compiling, []
        for _, req, _ in compiling:
            req.finish(FinishReason.ERROR, error=message)
            deltas.append(self.scheduler.make_delta(req, []))
        for req in list(self.scheduler.requests.values()):
            self.scheduler.abort([req.request_id])
            req.finish(FinishReason.ERROR, error=message)
            deltas.append(self.scheduler.make_delta(req, []))
        return deltas

    # ---- stepping --------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self._pending) or self.scheduler.has_unfinished \
            or self._inflight is not None or bool(self._compiling)

    def step(self) -> list[RequestDelta]:
        """Run one step (if anything is scheduled) and return every delta produced since the
        last call."""
        if self._compiling:
            self._admit_compiled()
        deltas, self._pending = self._pending, []
        if self.executor.supports_lookahead:
            deltas += self._step_ahead()
        elif self.scheduler.has_unfinished:
            step = self.scheduler.schedule()
            if step.chunks:
                self._attach_bitmask(step)
                deltas += self.scheduler.update(step, self.executor.execute(step))
            else:
                self.scheduler.requeue_finished(step)
        if self.detokenizer is not None and deltas:
            self.detokenizer.fill(deltas)
        return deltas

    def _step_ahead(self) -> list[RequestDelta]:
        """Submit the next step before collecting the one in flight, so the model goes from one
        step to the next without waiting for this process (its wake-up, ``update``,
        ``schedule``, the frames both ways); what the caller does with the deltas overlaps the
        next step too. When the next step cannot be picked ahead (see
        ``Scheduler.schedule_ahead``), collect first and schedule normally on the next call."""
        inflight = self._inflight
        if inflight is None:
            if not self.scheduler.has_unfinished:
                return []
            inflight = self.scheduler.schedule()
            if not inflight.chunks:
                self.scheduler.requeue_finished(inflight)
                return []
            self._attach_bitmask(inflight)
            self.executor.submit(inflight)
        ahead = self.scheduler.schedule_ahead(inflight)
        if ahead is not None:
            self.executor.submit(ahead)
        self._inflight = ahead
        return self.scheduler.update(inflight, self.executor.collect(inflight))

    def _attach_bitmask(self, step: StepInput) -> None:
        """The allowed tokens of every constrained row that samples in ``step`` (computed now:
        each matcher has seen every token sampled so far, since ``schedule_ahead`` never runs
        ahead of a constrained request)."""
        if not self._constrained:
            return
        requests = self.scheduler.requests
        self._constrained = {rid for rid in self._constrained if rid in requests}
        rows: list[int] = []
        matchers = []
        j = 0
        for chunk in step.chunks:
            if chunk.sample:
                if chunk.request_id in self._constrained:
                    rows.append(j)
                    matchers.append(requests[chunk.request_id].grammar)
                j += 1
        if rows:
            step.bitmask = self.grammars.bitmask(rows, matchers)

    def get_stats(self) -> EngineStats:
        s, bm = self.scheduler, self.block_manager
        return EngineStats(
            num_running=len(s.running), num_waiting=len(s.waiting),
            num_preempted_total=s.num_preempted_total, kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks, prefix_cache_hit_rate=bm.hit_rate,
            prompt_tokens_total=s.prompt_tokens_total,
            generation_tokens_total=s.generation_tokens_total,
            num_requests_finished_total=s.num_finished_total,
            kv_bytes_reserved=bm.num_blocks * self.kv_bytes_per_block,
            kv_bytes_used=bm.num_used_blocks * self.kv_bytes_per_block,
            kv_bytes_prefix_cached=bm.num_evictable_blocks * self.kv_bytes_per_block,
            processes=resident_memory({"engine": os.getpid(), **self.executor.process_ids()}))

    def reset_prefix_cache(self) -> None:
        self.block_manager.reset_prefix_cache()

    def shutdown(self) -> None:
        self.grammars.shutdown()
        self.executor.shutdown()


