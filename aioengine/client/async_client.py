"""AsyncMPClient: the engine in child processes, driven from the host's own event loop.

One output task receives every engine message (``engine_messages``) and updates per-request
state; each stream's consumer builds its ``RequestOutput`` when it wakes, so a slow consumer only
merges steps and never holds anyone back. Death is seen three ways (``engine_death``): the
supervisor's monitor thread, the output channel closing under us (``PeerClosedError``), and an
``EngineFailure`` message.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

import anyio

from aioengine.client.admission import Admission
from aioengine.client.backends import check_transport, current_backend
from aioengine.client.chat_template import ChatMessage
from aioengine.client.dp import replica_calls
from aioengine.client.dp.launch import launch_replicas
from aioengine.client.dp.replica_calls import on_replica_dead
from aioengine.client.dp.replicas import build_replicas, close_all_sync, weak_callback
from aioengine.client.dp.router import PrefixRouter
from aioengine.client.embed import (
    EmbeddingModel,
    EmbeddingOutput,
    EmbedInput,
    check_dimensions,
    embedding_token_ids,
    shorten,
)
from aioengine.client.engine_link import EngineLink
from aioengine.client.inputs import (
    Prompt,
    chat_token_ids,
    check_params,
    check_priority,
    check_request_id,
    prompt_token_ids,
    text_size,
)
from aioengine.client.launch import EngineReady
from aioengine.client.output_task import output_loop
from aioengine.client.outputs import RequestOutput
from aioengine.client.request_state import RequestState
from aioengine.client.request_stream import RequestStream
from aioengine.client.score import RerankResult, ScoreModel, ScoreOutput, pair_token_ids
from aioengine.client.tokenizer import LONG_TEXT_CHARS, Tokenizer, run_long_text
from aioengine.config import EngineConfig
from aioengine.hub.pooling import read_pooling_config
from aioengine.messages.engine_io import AbortRequests, AddRequest, EngineStats
from aioengine.messages.sampling_params import SamplingParams
from aioengine.runtime.errors import EngineDeadError
from aioengine.runtime.process_tree import resident_memory
from aioengine.runtime.supervisor_guard import check_main_is_guarded

# Longer texts are templated and tokenized in a worker thread: a chat message of a few MB took
# seconds of tokenizer time (docs/benchmarks.md), and on the event loop it stalled every other
# stream of the host (and a server's /health) for that long. Shorter ones stay on the loop (they
# are quick; the thread hand-off would cost more than it saves).
INLINE_TEXT_CHARS = LONG_TEXT_CHARS


class AsyncMPClient:
    """Embeds an engine in the running event loop: asyncio (or uvloop), or trio. Use ``async
    with``, or ``await start()`` and ``await shutdown()``. A client that is dropped without
    ``shutdown()`` stops its engine when it is garbage-collected (its output task holds it only
    weakly; an open stream keeps it alive), or at the latest at interpreter exit; that stop
    blocks the collecting thread while the processes are joined, so prefer ``shutdown()``.

    A client belongs to the event loop that started it: using it from any other loop raises
    ``RuntimeError`` (from another thread, submit to its loop with
    ``asyncio.run_coroutine_threadsafe`` or ``trio.from_thread.run``, or give each loop its own
    client). Under trio the engine's channels must have a trio driver (shm, zmq and uds do;
    see ``backends.check_transport``).

    The engine (and its workers) run in spawned child processes; this process only holds the
    client and one output task, and never imports torch. Start it under
    ``if __name__ == "__main__":``, as ``spawn`` requires. Every bad input raises ``ValueError``
    before anything is sent; a dead engine raises ``EngineDeadError`` in every open stream and
    in every later call.

    Example::

        async with AsyncMPClient(EngineConfig(model="tiny")) as client:
            async for out in client.generate("Once upon a time", SamplingParams(max_tokens=32)):
                print(out.delta_text, end="")
    """

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        """The ``EngineConfig`` the engine is started with."""
        if not isinstance(self.config, EngineConfig):
            raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
        self._link = EngineLink(self.config)
        self._tokenizer: Tokenizer | None = None
        self._embedding_model: EmbeddingModel | None = None
        self._score_model: ScoreModel | None = None
        self._admission = Admission(self.config.max_queued_requests,
                                    self.config.max_queued_tokens)

    # ---- lifecycle ----------------------------------------------------------------------
    async def __aenter__(self) -> AsyncMPClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def start(self) -> None:
        """Spawn the engine (and its workers) and wait for READY. Idempotent while running;
        ``RuntimeError`` after ``shutdown()`` (a client is not restartable)."""
        link = self._link
        if link.closed:
            raise RuntimeError("this AsyncMPClient was shut down; create a new one")
        if link.engine is not None:
            return
        backend = current_backend()  # asyncio's own objects under asyncio, trio's under trio
        check_transport(self.config.transport, backend.name)
        check_main_is_guarded()  # before anything is bound: a child exits here
        link.backend = backend
        # The deaths hold no reference to us: the monitor threads must not keep us alive.
        replicas = build_replicas(self.config.data_parallel_size, link.death, link.calls,
                                  link.by_wire, weak_callback(link, on_replica_dead), backend)
        engines = await launch_replicas(self.config, replicas, backend)
        link.engine = engines[0]
        try:
            self._tokenizer = link.engine.tokenizer or await backend.to_thread(
                Tokenizer.from_dir, link.engine.tokenizer_path)
        except BaseException:
            link.engine = None  # not started: shutdown() has nothing to stop
            with backend.shielded():
                await backend.gather(*(e.close(backend) for e in engines))
            raise
        link.replicas = replicas
        if len(replicas) > 1:
            link.pick = PrefixRouter([r.load for r in replicas], self.config.block_size,
                                     policy=self.config.data_parallel_routing)
        # Runs if the owner forgets shutdown(): no child, file or segment outlives the host.
        self._finalizer = weakref.finalize(self, close_all_sync, engines)
        link.output_tasks = [backend.spawn(
            output_loop, r.router, r.death, weakref.WeakMethod(link.abort_soon), e.outputs,
            name=f"aioengine-output-{i}")
            for i, (r, e) in enumerate(zip(replicas, engines, strict=True))]
        for r in replicas:
            r.death.watching = True  # from now on a death is declared (start() raised before)

    async def shutdown(self) -> None:
        """Stop the engine and release every resource. Idempotent. From a loop other than the
        client's own: ``RuntimeError``, unless that loop is closed already (then the engine
        is stopped from here)."""
        link = self._link
        if link.closed:
            return
        backend = link.backend
        if backend is not None and not backend.is_current():
            if not backend.is_closed():
                link.check_loop()  # raises
            # Its tasks died with their loop: only the processes remain.
            link.closed = link.death.quiet = True
            link.death.declare(EngineDeadError("the client was shut down"))
            if link.engine is not None:
                await anyio.to_thread.run_sync(self._finalizer)  # on this loop's library
            return
        link.closed = link.death.quiet = True
        for r in link.replicas:
            r.death.quiet = True
        link.death.declare(EngineDeadError("the client was shut down"))
        if backend is None:
            return
        with backend.shielded():  # under trio, even from a cancelled scope
            await backend.cancel_and_wait([*link.output_tasks, *link.background])
            if link.engine is not None:
                await backend.gather(*(r.engine.close(backend) for r in link.replicas
                                       if r.engine is not None))
                self._finalizer.detach()

    @property
    def is_dead(self) -> bool:
        """True once the engine died or the client was shut down."""
        return self._link.death.error is not None

    async def wait_dead(self) -> EngineDeadError:
        """Return once the engine is declared dead (a child died, its channel closed, it
        failed), with the cause; never returns while it lives (cancel the wait instead). It
        also returns once the client is shut down (``is_dead`` is True then too)."""
        death = self._link.death
        await death.declared.wait()
        return death.fresh_error()

    @property
    def tokenizer(self) -> Tokenizer:
        """The host-side tokenizer (``encode``, ``decode``, ``apply_chat_template``)."""
        self._link.check_started()
        assert self._tokenizer is not None
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """The longest prompt plus output the engine accepts (its context length)."""
        ready: EngineReady = self.engine_info
        return ready.max_model_len

    @property
    def engine_info(self) -> Any:
        """The engine's READY payload (``num_kv_blocks``, ``max_model_len``, ...)."""
        self._link.check_started()
        assert self._link.engine is not None
        return self._link.engine.ready

    @property
    def backend(self) -> str | None:
        """The event-loop library the client was started on (``"asyncio"`` or ``"trio"``),
        ``None`` before ``start()``."""
        return self._link.backend.name if self._link.backend is not None else None

    @property
    def process_ids(self) -> dict[str, int]:
        """Pids of the processes this client started directly (the engine, and the
        detokenizer with ``detokenize_in="process"``; with replicas, ``-<index>`` after each
        name); workers are the engine's children."""
        self._link.check_started()
        return replica_calls.process_ids(self._link.replicas)

    @property
    def replicas_alive(self) -> int:
        """Replicas serving (``data_parallel_size`` unless one died in ``degrade`` mode)."""
        return len(self._link.live())

    # ---- requests -----------------------------------------------------------------------
    def prepare(self, prompt: Prompt, params: SamplingParams | None = None
                ) -> tuple[list[int], SamplingParams]:
        """Check a request and tokenize its prompt: ``ValueError`` for anything bad."""
        self._link.check_alive()
        self._check_generates()
        tok = self.tokenizer
        return prompt_token_ids(tok, prompt, self.max_model_len), check_params(params,
                                                                               tok.vocab_size)

    def prepare_chat(self, messages: Sequence[ChatMessage], params: SamplingParams | None = None,
                     **template_kwargs: Any) -> tuple[list[int], SamplingParams]:
        """``prepare`` for a conversation: apply the chat template, then check and tokenize."""
        self._link.check_alive()
        self._check_generates()
        return self.prepare(chat_token_ids(self.tokenizer, messages, self.max_model_len,
                                           **template_kwargs), params)

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, *,
                       request_id: str | None = None, priority: int = 0
                       ) -> AsyncGenerator[RequestOutput, None]:
        """Stream one request's outputs. Leaving the loop early (break, cancellation, closing
        the generator) aborts the request in the engine."""
        if isinstance(prompt, str) and len(prompt) > INLINE_TEXT_CHARS:
            ids, checked = await run_long_text(self.prepare, prompt, params)
        else:
            ids, checked = self.prepare(prompt, params)
        # aclosing: closing this generator closes the inner one now (its cleanup aborts the
        # request), not whenever the loop's async-generator finalizer gets to it.
        async with aclosing(self.generate_prepared(ids, checked, request_id=request_id,
                                                   priority=priority)) as stream:
            async for out in stream:
                yield out

    async def chat(self, messages: Sequence[ChatMessage], params: SamplingParams | None = None,
                   *, request_id: str | None = None, priority: int = 0,
                   **template_kwargs: Any) -> AsyncGenerator[RequestOutput, None]:
        """Apply the model's chat template to ``messages`` and stream the reply."""
        if text_size(messages) > INLINE_TEXT_CHARS:
            ids, checked = await run_long_text(self.prepare_chat, messages, params,
                                              **template_kwargs)
        else:
            ids, checked = self.prepare_chat(messages, params, **template_kwargs)
        async with aclosing(self.generate_prepared(ids, checked, request_id=request_id,
                                                   priority=priority)) as stream:
            async for out in stream:
                yield out

    async def embed(self, input: EmbedInput, *, truncate: bool | int = True,
                    dimensions: int | None = None, request_id: str | None = None,
                    priority: int = 0) -> EmbeddingOutput:
        """The embedding of one text (or list of token ids) from an embedding model: its
        pooled, as the model's sentence-transformers files say, vector. ``truncate``: True cuts
        a long input at the model's length (sentence-transformers' ``max_seq_length``), an int
        at that many tokens, False refuses it; ``dimensions`` shortens the vector where the
        model was trained for it (Matryoshka). Concurrent calls share engine steps.
        ``ValueError`` for a bad input or a model that does not embed."""
        ids = self.prepare_embedding(input, truncate, dimensions)
        return await self.embed_prepared(ids, dimensions, request_id=request_id,
                                         priority=priority)

    def prepare_embedding(self, input: EmbedInput, truncate: bool | int = True,
                          dimensions: int | None = None) -> list[int]:
        """Check an embedding request and tokenize its input (``embed``'s first half: a
        batch caller checks every input before sending any); ``ValueError`` for anything bad."""
        model = self.embedding_model
        check_dimensions(dimensions, model)
        return embedding_token_ids(self.tokenizer, input, model, truncate)

    async def embed_prepared(self, ids: list[int], dimensions: int | None = None, *,
                             request_id: str | None = None,
                             priority: int = 0) -> EmbeddingOutput:
        """``embed`` for the output of ``prepare_embedding``."""
        model = self.embedding_model
        final, vector = await self._pooled(ids, 0, request_id, priority)
        return EmbeddingOutput(final.request_id, shorten(vector, dimensions, model),
                               final.prompt_token_ids, final.metrics)

    async def score(self, text_1: str, text_2: str, *, truncate: bool | int = True,
                    request_id: str | None = None, priority: int = 0) -> ScoreOutput:
        """How relevant ``text_2`` is to ``text_1`` (a query and a document), from a reranker
        (a cross-encoder): its logit through the model's activation, as sentence-transformers'
        CrossEncoder gives it. ``truncate`` as for ``embed`` (the longer text is cut first).
        ``ValueError`` for a bad pair or a model that does not score."""
        ids, pair_start = self.prepare_score(text_1, text_2, truncate)
        return await self.score_prepared(ids, pair_start, request_id=request_id,
                                         priority=priority)

    async def rerank(self, query: str, documents: Sequence[str], *, top_n: int | None = None,
                     truncate: bool | int = True) -> list[RerankResult]:
        """``documents`` scored against ``query`` (concurrently: the engine batches them),
        most relevant first; ``top_n`` keeps that many."""
        if isinstance(documents, str) or not isinstance(documents, Sequence) or not documents:
            raise ValueError("documents must be a non-empty list of strings")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                                  or top_n < 1):
            raise ValueError(f"top_n must be a positive integer, got {top_n!r}")
        prepared = [self.prepare_score(query, d, truncate) for d in documents]
        backend = self._link.backend
        assert backend is not None  # started: prepare_score checked
        # every one to its end (none left running), then the first failure if any
        scores = await backend.gather(*(self.score_prepared(ids, start)
                                        for ids, start in prepared), return_exceptions=True)
        failed = next((s for s in scores if isinstance(s, BaseException)), None)
        if failed is not None:
            raise failed
        ranked = sorted(range(len(documents)), key=lambda i: -scores[i].score)[:top_n]
        return [RerankResult(i, scores[i].score, documents[i]) for i in ranked]

    def prepare_score(self, text_1: str, text_2: str,
                      truncate: bool | int = True) -> tuple[list[int], int]:
        """Check a text pair and tokenize it (``score``'s first half): the ids and where the
        second text starts. ``ValueError`` for anything bad."""
        return pair_token_ids(self.tokenizer, text_1, text_2, self.score_model, truncate)

    async def score_prepared(self, ids: list[int], pair_start: int, *,
                             request_id: str | None = None, priority: int = 0) -> ScoreOutput:
        """``score`` for the output of ``prepare_score``."""
        model = self.score_model
        final, logits = await self._pooled(ids, pair_start, request_id, priority)
        return ScoreOutput(final.request_id, model.score(logits), final.prompt_token_ids,
                           final.metrics)

    async def _pooled(self, ids: list[int], pair_start: int, request_id: str | None,
                      priority: int) -> tuple[RequestOutput, list[float]]:
        """Run one pooling request: its last output and its vector (or logits)."""
        final: RequestOutput | None = None
        async with aclosing(self.generate_prepared(ids, SamplingParams(max_tokens=1),
                                                   request_id=request_id, priority=priority,
                                                   pooling=True, pair_start=pair_start)
                            ) as stream:
            async for out in stream:
                final = out
        assert final is not None and final.finished
        if final.embedding is None:
            if final.finish_reason == "error":
                raise ValueError(final.error or "the engine refused the input")
            raise RuntimeError(f"request {final.request_id} ended with "
                               f"{final.finish_reason!r} before its result was computed")
        return final, final.embedding

    def _check_generates(self) -> None:
        task = self.engine_info.task
        if task != "generate":
            answers = "embed (/v1/embeddings)" if task == "embed" \
                else "score and rerank (/v1/rerank, /score)"
            kind = "an embedding" if task == "embed" else "a reranking"
            raise ValueError(f"model {self.config.model!r} is {kind} model: it answers "
                             f"{answers}, not text generation")

    @property
    def embedding_model(self) -> EmbeddingModel:
        """The served model's pooling and lengths; ``ValueError`` if it does not embed."""
        if self._embedding_model is None:
            path = self._model_path_for("embed", "embeddings need an embedding model (an "
                                        "encoder such as all-minilm-l6-v2)")
            self._embedding_model = EmbeddingModel.read(path, read_pooling_config(path),
                                                        self.max_model_len)
        return self._embedding_model

    @property
    def score_model(self) -> ScoreModel:
        """The served reranker's length and activation; ``ValueError`` if it does not score."""
        if self._score_model is None:
            path = self._model_path_for("score", "scores need a reranker (a cross-encoder, "
                                        "BertForSequenceClassification)")
            self._score_model = ScoreModel.read(path, self.max_model_len)
        return self._score_model

    def _model_path_for(self, task: str, needs: str) -> str:
        link = self._link
        link.check_started()
        assert link.engine is not None
        served = link.engine.ready.task
        if served != task:
            what = {"generate": "generates text", "embed": "is an embedding model",
                    "score": "is a reranker"}.get(served, f"serves {served!r}")
            raise ValueError(f"the model {self.config.model!r} {what}: {needs}")
        return link.engine.resolved.model_path

    async def generate_prepared(self, ids: list[int], params: SamplingParams, *,
                                request_id: str | None = None, priority: int = 0,
                                pooling: bool = False, pair_start: int = 0
                                ) -> AsyncGenerator[RequestOutput, None]:
        """``generate`` for the output of ``prepare`` (batch callers check everything first);
        ``pooling``: an embedding or scoring request (``embed``, ``score``), ``pair_start``
        where a scored pair's second text starts."""
        link = self._link
        link.check_alive()
        link.check_loop()
        assert link.backend is not None
        rid = check_request_id(request_id, link.streams)
        priority = check_priority(priority)
        now = time.time()
        # a pooling request answers a vector, never text: no detokenizer to set up for it
        detok = (self.tokenizer.detokenizer(ids, params.skip_special_tokens)
                 if self.config.detokenize_in == "host" and not pooling else None)
        # A stream that ended here first (break, stop string, abort) may still run in the
        # engine, with its outputs and our abort in flight: a fresh wire id per request keeps
        # a caller's reused id apart from it.
        wire_id = f"{rid}#{next(link.wire_seq)}"
        self._admission.admit(wire_id, len(ids))  # EngineOverloadedError: nothing was sent
        try:
            replica = link.replicas[link.pick.pick(ids) if link.pick is not None else 0]
        except LookupError:  # no replica alive: the client is being declared dead
            self._admission.started(wire_id)
            raise link.death.fresh_error() from None
        stream = RequestStream(RequestState(rid, ids, params, detok, now), wire_id,
                               replica.index, link.backend.event())
        state, load = stream.state, replica.load
        load.waiting += 1
        load.routed += 1
        link.streams[rid] = stream  # registered before any await: duplicate ids are caught
        link.by_wire[wire_id] = stream
        waiting = True  # counted by admission control until the first output arrives
        try:
            # eos_token_id None: the engine stops on every eos id the model declares.
            await link.send(AddRequest(wire_id, ids, params, now, priority, pooling=pooling,
                                       pair_start=pair_start), replica)
            while True:
                if not state.has_news():
                    # One engine: the replica's death is the client's; with replicas either
                    # ends this stream.
                    dead = link.death if link.death.error is not None else replica.death
                    if dead.error is not None:
                        raise dead.fresh_error()
                    stream.event.clear()
                    await stream.event.wait()
                    continue
                if waiting:
                    self._admission.started(wire_id)
                    waiting = False
                    load.waiting -= 1
                    load.running += 1
                out = state.take_output()
                yield out
                if out.finished:
                    return
        finally:
            self._admission.started(wire_id)
            if waiting:
                load.waiting -= 1
            else:
                load.running -= 1
            load.finished += 1
            if link.streams.get(rid) is stream:
                del link.streams[rid]
            if not state.finished and link.death.error is None \
                    and replica.death.error is None:
                link.abort_soon(wire_id)
            del link.by_wire[wire_id]

    async def abort(self, request_id: str) -> None:
        """Abort a request: its stream ends with finish_reason "abort" and the engine frees its
        blocks. Unknown or finished ids are ignored."""
        link = self._link
        link.check_alive()
        link.check_loop()
        stream = link.streams.get(request_id)
        if stream is None or stream.state.finished:
            return
        stream.state.fail("abort", None, time.time())
        stream.event.set()
        replica = link.replicas[stream.replica]
        if replica.death.error is None:  # a dead replica (degrade) holds nothing to free
            await link.send(AbortRequests([stream.wire_id]), replica)

    async def get_stats(self, timeout: float = 30.0) -> EngineStats:
        """A snapshot of the engine's scheduler and KV cache. With data parallelism: the total
        over the live replicas, each replica's own in ``replicas`` (``None`` for a dead one).
        ``processes`` starts with this (the host) process."""
        stats = await replica_calls.get_stats(self._link, timeout)
        stats.processes = [*resident_memory({"host": os.getpid()}), *stats.processes]
        return stats

    async def check_health(self, timeout: float = 10.0) -> None:
        """Raise ``EngineDeadError`` unless the engine (every live replica) answers a ping
        within ``timeout``."""
        await replica_calls.each_live(self._link, "ping", timeout)

    async def reset_prefix_cache(self, timeout: float = 30.0) -> Any:
        """Forget every cached prompt prefix (blocks in use keep serving their requests);
        with data parallelism on every live replica (a list of their answers)."""
        if len(self._link.replicas) == 1:
            return await self._link.call("reset_prefix_cache", timeout=timeout)
        if self._link.pick is not None:
            self._link.pick.forget_all()
        return await replica_calls.each_live(self._link, "reset_prefix_cache", timeout)
