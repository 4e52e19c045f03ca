"""SyncMPClient: the multiprocess client for blocking callers (``LLM``, scripts, notebooks).

It drives an ``AsyncMPClient`` on an event loop in a background thread through an anyio
blocking portal, so there is one implementation of streams, aborts and engine death.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import anyio

from aioengine.client.async_client import AsyncMPClient
from aioengine.client.backends import BACKENDS, check_transport
from aioengine.client.chat_template import ChatMessage
from aioengine.client.inputs import Prompt
from aioengine.client.outputs import RequestOutput
from aioengine.client.portal_call import call_interruptibly
from aioengine.client.portal_thread import PortalThread, in_trio_run
from aioengine.client.tokenizer import Tokenizer
from aioengine.config import EngineConfig
from aioengine.messages.engine_io import EngineStats
from aioengine.messages.sampling_params import SamplingParams
from aioengine.runtime.supervisor_guard import check_main_is_guarded

T = TypeVar("T")


class SyncMPClient:
    """The multiprocess engine for blocking code: an ``AsyncMPClient`` driven on its own event
    loop in a background thread (asyncio's by default; ``backend="trio"`` runs it under trio,
    ``use_uvloop=True`` on uvloop). Starting happens in the constructor; use it as a context
    manager or call ``shutdown()``. ``KeyboardInterrupt`` (Ctrl-C) during a call or a
    ``stream`` cancels its work on that loop, which aborts its requests in the engine, and then
    propagates; the client stays usable.

    Example::

        with SyncMPClient(EngineConfig(model="tiny")) as client:
            for out in client.stream("Once upon a time", SamplingParams(max_tokens=16)):
                print(out.delta_text, end="")
    """

    def __init__(self, config: EngineConfig | None = None, *, use_uvloop: bool = False,
                 backend: Literal["asyncio", "trio"] = "asyncio") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend != "asyncio" and use_uvloop:
            raise ValueError("use_uvloop=True runs the client on asyncio's loop (uvloop): it "
                             f"needs backend='asyncio', got {backend!r}")
        if config is not None and isinstance(config, EngineConfig):
            check_transport(config.transport, backend)  # before a thread is started
        if backend == "trio" and in_trio_run():
            raise RuntimeError(
                "SyncMPClient(backend='trio') blocks, and trio refuses blocking calls into its "
                "loop from a thread that runs a trio loop itself: in a trio program use "
                "AsyncMPClient, or this client from a worker thread (trio.to_thread.run_sync)")
        check_main_is_guarded()  # on the caller's thread, where the child can exit cleanly
        options = {"use_uvloop": use_uvloop} if backend == "asyncio" else {}
        self._loop_thread = PortalThread(options, backend)
        self._portal = self._loop_thread.portal
        self._client = AsyncMPClient(config)
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._run(self._client.start)
        except BaseException:
            try:
                self._portal.call(self._client.shutdown)
            finally:
                self._loop_thread.close(cancel_remaining=True)
            raise

    def __enter__(self) -> SyncMPClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def tokenizer(self) -> Tokenizer:
        """The host-side tokenizer."""
        return self._client.tokenizer

    @property
    def max_model_len(self) -> int:
        """The engine's context length."""
        return self._client.max_model_len

    @property
    def is_dead(self) -> bool:
        """True once the engine died or the client was shut down."""
        return self._client.is_dead

    @property
    def async_client(self) -> AsyncMPClient:
        """The ``AsyncMPClient`` underneath (use it through ``call_async``)."""
        return self._client

    def prepare(self, prompt: Prompt, params: SamplingParams | None
                ) -> tuple[list[int], SamplingParams]:
        """Check a request and tokenize its prompt (``ValueError`` for anything bad)."""
        return self._client.prepare(prompt, params)

    def prepare_chat(self, messages: Sequence[ChatMessage], params: SamplingParams | None,
                     **template_kwargs: Any) -> tuple[list[int], SamplingParams]:
        """``prepare`` for a conversation (applies the chat template)."""
        return self._client.prepare_chat(messages, params, **template_kwargs)

    def generate_all(self, requests: Sequence[tuple[list[int], SamplingParams]],
                     on_finished: Callable[[], object] | None = None) -> list[RequestOutput]:
        """Run prepared requests concurrently; final outputs in input order. If one fails (the
        engine died), the others are cancelled, which aborts them."""
        return self._run(self._generate_all, list(requests), on_finished)

    async def _generate_all(self, requests: list[tuple[list[int], SamplingParams]],
                            on_finished: Callable[[], object] | None) -> list[RequestOutput]:
        results: list[RequestOutput | None] = [None] * len(requests)

        async def one(i: int) -> None:
            ids, params = requests[i]
            async for out in self._client.generate_prepared(ids, params):
                results[i] = out
            if on_finished is not None:
                on_finished()

        async with anyio.create_task_group() as tg:
            for i in range(len(requests)):
                tg.start_soon(one, i)
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None
               ) -> Iterator[RequestOutput]:
        """Iterate one request's outputs from blocking code; closing the iterator, or Ctrl-C
        while it waits, aborts the request."""
        ids, params = self.prepare(prompt, params)
        agen = self._client.generate_prepared(ids, params)
        try:
            while True:
                try:
                    yield self._run(agen.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            self._portal.call(agen.aclose)

    def call_async(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on the client's event loop and return its result (for code
        that wants the async API, e.g. ``lambda: client.async_client.get_stats()``)."""
        return self._run(fn, *args)

    def abort(self, request_id: str) -> None:
        """Abort a running request; unknown or finished ids are ignored."""
        self._run(self._client.abort, request_id)

    def get_stats(self) -> EngineStats:
        """A snapshot of the engine's scheduler and KV cache."""
        return self._run(self._client.get_stats)

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` unless the engine answers a ping."""
        self._run(self._client.check_health)

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        # Ctrl-C here cancels the task on the loop (aborting its requests) before propagating.
        return call_interruptibly(self._portal, fn, *args)

    def shutdown(self) -> None:
        """Stop the engine and the background loop. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._portal.call(self._client.shutdown)
        finally:
            self._loop_thread.close()
