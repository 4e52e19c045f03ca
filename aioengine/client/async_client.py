"""AsyncMPClient: the engine in child processes, driven from the host's own event loop.

One output task receives every engine message (``engine_messages``) and updates per-request
state; each stream's consumer builds its ``RequestOutput`` when it wakes, so a slow consumer only
merges steps and never holds anyone back. Death is seen three ways (``engine_death``): the
supervisor's monitor thread, the output channel closing under us (``PeerClosedError``), and an
``EngineFailure`` message.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

import msgspec

from aioengine.client.admission import Admission
from aioengine.client.chat_template import ChatMessage
from aioengine.client.dp import replica_calls
from aioengine.client.dp.replica_calls import on_replica_dead
from aioengine.client.dp.replicas import (
    Replica,
    build_replicas,
    close_all_sync,
    launch_replicas,
    weak_callback,
)
from aioengine.client.dp.router import PrefixRouter
from aioengine.client.engine_death import EngineDeath
from aioengine.client.inputs import (
    Prompt,
    chat_token_ids,
    check_params,
    check_priority,
    check_request_id,
    prompt_token_ids,
    text_size,
)
from aioengine.client.launch import EngineProcess
from aioengine.client.output_task import output_loop
from aioengine.client.outputs import RequestOutput
from aioengine.client.request_state import RequestState
from aioengine.client.request_stream import RequestStream
from aioengine.client.tokenizer import LONG_TEXT_CHARS, Tokenizer, run_long_text
from aioengine.config import EngineConfig
from aioengine.messages.engine_io import (
    AbortRequests,
    AddRequest,
    ClientMessage,
    EngineStats,
    UtilityCall,
)
from aioengine.messages.sampling_params import SamplingParams
from aioengine.runtime.errors import EngineDeadError
from aioengine.runtime.supervisor_guard import check_main_is_guarded
from transports.errors import TransportError

# Longer texts are templated and tokenized in a worker thread: a 3.9 MB chat message took 5-9 s
# of tokenizer time, and on the event loop it stalled every other stream of the host (and a
# server's /health) for that long. Shorter ones stay on the loop (well under a millisecond;
# the thread hand-off would cost more than it saves).
INLINE_TEXT_CHARS = LONG_TEXT_CHARS


class AsyncMPClient:
    """Embeds an engine in the running event loop. Use ``async with``, or ``await start()`` and
    ``await shutdown()``. A client that is dropped without ``shutdown()`` stops its engine when
    it is garbage-collected (its output task holds it only weakly; an open stream keeps it
    alive), or at the latest at interpreter exit; that stop blocks the collecting thread while
    the processes are joined, so prefer ``shutdown()``.

    A client belongs to the event loop that started it: using it from any other loop raises
    ``RuntimeError`` (from another thread, submit to its loop with
    ``asyncio.run_coroutine_threadsafe``, or give each loop its own client).

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
        self._engine: EngineProcess | None = None
        self._tokenizer: Tokenizer | None = None
        self._streams: dict[str, RequestStream] = {}  # by the caller's request id
        self._by_wire: dict[str, RequestStream] = {}  # by the id the engine knows
        self._wire_seq = itertools.count()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._pending_aborts: list[tuple[int, str]] = []  # (replica, wire id)
        self._background: set[asyncio.Task[None]] = set()
        self._output_tasks: list[asyncio.Task[None]] = []
        self._replicas: list[Replica] = []  # one engine each (``client/dp``)
        self._pick: PrefixRouter | None = None  # with data parallelism only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._death = EngineDeath(self._streams, self._calls)
        self._admission = Admission(self.config.max_queued_requests,
                                    self.config.max_queued_tokens)
        self._closed = False
        self._encoder = msgspec.msgpack.Encoder()

    # ---- lifecycle ----------------------------------------------------------------------
    async def __aenter__(self) -> AsyncMPClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def start(self) -> None:
        """Spawn the engine (and its workers) and wait for READY. Idempotent while running;
        ``RuntimeError`` after ``shutdown()`` (a client is not restartable)."""
        if self._closed:
            raise RuntimeError("this AsyncMPClient was shut down; create a new one")
        if self._engine is not None:
            return
        check_main_is_guarded()  # before anything is bound: a child exits here
        self._loop = self._death.loop = asyncio.get_running_loop()
        # The deaths hold no reference to us: the monitor threads must not keep us alive.
        replicas = build_replicas(self.config.data_parallel_size, self._death, self._calls,
                                  self._by_wire, weak_callback(self, on_replica_dead))
        engines = await launch_replicas(self.config, replicas, self._loop)
        self._engine = engines[0]
        try:
            self._tokenizer = await asyncio.to_thread(Tokenizer.from_dir,
                                                      self._engine.tokenizer_path)
        except BaseException:
            await asyncio.gather(*(e.close() for e in engines))
            raise
        self._replicas = replicas
        if len(replicas) > 1:
            self._pick = PrefixRouter([r.load for r in replicas], self.config.block_size,
                                      policy=self.config.data_parallel_routing)
        # Runs if the owner forgets shutdown(): no child, file or segment outlives the host.
        self._finalizer = weakref.finalize(self, close_all_sync, engines)
        self._output_tasks = [self._loop.create_task(
            output_loop(r.router, r.death, weakref.WeakMethod(self._abort_soon),
                        e.outputs), name=f"aioengine-output-{i}")
            for i, (r, e) in enumerate(zip(replicas, engines, strict=True))]
        for r in replicas:
            r.death.watching = True  # from now on a death is declared (start() raised before)

    async def shutdown(self) -> None:
        """Stop the engine and release every resource. Idempotent. From a loop other than the
        client's own: ``RuntimeError``, unless that loop is closed already (then the engine
        is stopped from here)."""
        if self._closed:
            return
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            if not self._loop.is_closed():
                self._check_loop()  # raises
            # Its tasks died with their loop: only the processes remain.
            self._closed = self._death.quiet = True
            self._death.declare(EngineDeadError("the client was shut down"))
            if self._engine is not None:
                await asyncio.to_thread(self._finalizer)
            return
        self._closed = self._death.quiet = True
        for r in self._replicas:
            r.death.quiet = True
        self._death.declare(EngineDeadError("the client was shut down"))
        tasks = [*self._output_tasks, *self._background]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._engine is not None:
            await asyncio.gather(*(r.engine.close() for r in self._replicas
                                   if r.engine is not None))
            self._finalizer.detach()

    @property
    def is_dead(self) -> bool:
        """True once the engine died or the client was shut down."""
        return self._death.error is not None

    async def wait_dead(self) -> EngineDeadError:
        """Return once the engine is declared dead (a child died, its channel closed, it
        failed), with the cause; never returns while it lives (cancel the wait instead). It
        also returns once the client is shut down (``is_dead`` is True then too)."""
        await self._death.declared.wait()
        return self._death.fresh_error()

    @property
    def tokenizer(self) -> Tokenizer:
        """The host-side tokenizer (``encode``, ``decode``, ``apply_chat_template``)."""
        self._check_started()
        assert self._tokenizer is not None
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """The longest prompt plus output the engine accepts (its context length)."""
        self._check_started()
        assert self._engine is not None
        return self._engine.ready.max_model_len

    @property
    def engine_info(self) -> Any:
        """The engine's READY payload (``num_kv_blocks``, ``max_model_len``, ...)."""
        self._check_started()
        assert self._engine is not None
        return self._engine.ready

    @property
    def process_ids(self) -> dict[str, int]:
        """Pids of the processes this client started directly (the engine, and the
        detokenizer with ``detokenize_in="process"``; with replicas, ``-<index>`` after each
        name); workers are the engine's children."""
        self._check_started()
        return replica_calls.process_ids(self._replicas)

    @property
    def replicas_alive(self) -> int:
        """Replicas serving (``data_parallel_size`` unless one died in ``degrade`` mode)."""
        return sum(r.load.alive and r.death.error is None for r in self._replicas)

    def _check_started(self) -> None:
        if self._engine is None:
            raise RuntimeError("the client is not started: use 'async with AsyncMPClient(...)' "
                               "or 'await client.start()'")

    def _check_alive(self) -> None:
        self._check_started()
        if self._death.error is not None:
            raise self._death.fresh_error()

    def _check_loop(self) -> None:
        """The output task, events and futures all live on the loop that started the client;
        from another loop a stream would never be woken."""
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(
                "this AsyncMPClient is used from an event loop other than the one it was "
                f"started on ({self._loop!r}); use it only from that loop (from another "
                "thread: asyncio.run_coroutine_threadsafe), or give this loop its own client")

    # ---- requests -----------------------------------------------------------------------
    def prepare(self, prompt: Prompt, params: SamplingParams | None = None
                ) -> tuple[list[int], SamplingParams]:
        """Check a request and tokenize its prompt: ``ValueError`` for anything bad."""
        self._check_alive()
        tok = self.tokenizer
        return prompt_token_ids(tok, prompt, self.max_model_len), check_params(params,
                                                                               tok.vocab_size)

    def prepare_chat(self, messages: Sequence[ChatMessage], params: SamplingParams | None = None,
                     **template_kwargs: Any) -> tuple[list[int], SamplingParams]:
        """``prepare`` for a conversation: apply the chat template, then check and tokenize."""
        self._check_alive()
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

    async def generate_prepared(self, ids: list[int], params: SamplingParams, *,
                                request_id: str | None = None, priority: int = 0
                                ) -> AsyncGenerator[RequestOutput, None]:
        """``generate`` for the output of ``prepare`` (batch callers check everything first)."""
        self._check_alive()
        self._check_loop()
        rid = check_request_id(request_id, self._streams)
        priority = check_priority(priority)
        now = time.time()
        detok = (self.tokenizer.detokenizer(ids, params.skip_special_tokens)
                 if self.config.detokenize_in == "host" else None)
        # A stream that ended here first (break, stop string, abort) may still run in the
        # engine, with its outputs and our abort in flight: a fresh wire id per request keeps
        # a caller's reused id apart from it.
        wire_id = f"{rid}#{next(self._wire_seq)}"
        self._admission.admit(wire_id, len(ids))  # EngineOverloadedError: nothing was sent
        try:
            replica = self._replicas[self._pick.pick(ids) if self._pick is not None else 0]
        except LookupError:  # no replica alive: the client is being declared dead
            self._admission.started(wire_id)
            raise self._death.fresh_error() from None
        stream = RequestStream(RequestState(rid, ids, params, detok, now), wire_id,
                               replica.index)
        state, load = stream.state, replica.load
        load.waiting += 1
        load.routed += 1
        self._streams[rid] = stream  # registered before any await: duplicate ids are caught
        self._by_wire[wire_id] = stream
        waiting = True  # counted by admission control until the first output arrives
        try:
            # eos_token_id None: the engine stops on every eos id the model declares.
            await self._send(AddRequest(wire_id, ids, params, now, priority), replica)
            while True:
                if not state.has_news():
                    # One engine: the replica's death is the client's; with replicas either
                    # ends this stream.
                    dead = self._death if self._death.error is not None else replica.death
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
            if self._streams.get(rid) is stream:
                del self._streams[rid]
            if not state.finished and self._death.error is None \
                    and replica.death.error is None:
                self._abort_soon(wire_id)
            del self._by_wire[wire_id]

    async def abort(self, request_id: str) -> None:
        """Abort a request: its stream ends with finish_reason "abort" and the engine frees its
        blocks. Unknown or finished ids are ignored."""
        self._check_alive()
        self._check_loop()
        stream = self._streams.get(request_id)
        if stream is None or stream.state.finished:
            return
        stream.state.fail("abort", None, time.time())
        stream.event.set()
        replica = self._replicas[stream.replica]
        if replica.death.error is None:  # a dead replica (degrade) holds nothing to free
            await self._send(AbortRequests([stream.wire_id]), replica)

    async def get_stats(self, timeout: float = 30.0) -> EngineStats:
        """A snapshot of the engine's scheduler and KV cache. With data parallelism: the total
        over the live replicas, each replica's own in ``replicas`` (``None`` for a dead one)."""
        return await replica_calls.get_stats(self, timeout)

    async def check_health(self, timeout: float = 10.0) -> None:
        """Raise ``EngineDeadError`` unless the engine (every live replica) answers a ping
        within ``timeout``."""
        await replica_calls.each_live(self, "ping", timeout)

    async def reset_prefix_cache(self, timeout: float = 30.0) -> Any:
        """Forget every cached prompt prefix (blocks in use keep serving their requests);
        with data parallelism on every live replica (a list of their answers)."""
        if len(self._replicas) == 1:
            return await self._call("reset_prefix_cache", timeout=timeout)
        if self._pick is not None:
            self._pick.forget_all()
        return await replica_calls.each_live(self, "reset_prefix_cache", timeout)

    async def _call(self, method: str, *args: Any, timeout: float,
                    replica: Replica | None = None) -> Any:
        self._check_alive()
        self._check_loop()
        assert self._loop is not None
        replica = replica if replica is not None else self._replicas[0]
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._calls[call_id] = replica.calls[call_id] = fut
        try:
            await self._send(UtilityCall(call_id, method, list(args)), replica)
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._calls.pop(call_id, None)
            replica.calls.pop(call_id, None)

    # ---- sending ------------------------------------------------------------------------
    async def _send(self, msg: ClientMessage, replica: Replica) -> None:
        assert replica.engine is not None
        frame = self._encoder.encode(msg)
        death = replica.death
        try:
            async with replica.send_lock:
                if self._death.error is not None:
                    raise self._death.fresh_error()
                if death.error is not None:
                    raise death.fresh_error()
                await replica.engine.requests.send(frame)
        except TransportError as e:
            death.declare(EngineDeadError(f"the engine's request channel failed: {e}"))
            raise (self._death if self._death.error is not None else death).fresh_error() \
                from e

    def _abort_soon(self, request_id: str) -> None:
        """Abort from places that cannot await (a generator's cleanup, the output task)."""
        stream = self._by_wire.get(request_id)
        self._pending_aborts.append((stream.replica if stream is not None else 0, request_id))
        if len(self._pending_aborts) == 1 and self._loop is not None and not self._closed:
            task = self._loop.create_task(self._flush_aborts())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _flush_aborts(self) -> None:
        await asyncio.sleep(0)  # let a burst of cancellations collect into one message
        pending, self._pending_aborts = self._pending_aborts, []
        await replica_calls.send_aborts(self, pending)

