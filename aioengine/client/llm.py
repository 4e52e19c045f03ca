"""LLM: the synchronous API for batch work (public API)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from tqdm.auto import tqdm

from aioengine.client.chat_template import ChatMessage
from aioengine.client.embed import EmbeddingOutput, EmbedInput
from aioengine.client.factory import SyncClient, make_sync_client
from aioengine.client.inputs import Prompt, PromptTypeError
from aioengine.client.outputs import RequestOutput
from aioengine.client.score import RerankResult, ScoreOutput
from aioengine.client.sync_client import SyncMPClient
from aioengine.config import EngineConfig
from aioengine.messages.engine_io import EngineStats
from aioengine.messages.sampling_params import SamplingParams

ParamsArg = SamplingParams | Sequence[SamplingParams] | None


class LLM:
    """Batch generation from blocking code::

        with LLM(EngineConfig(model="tiny")) as llm:
            outs = llm.generate(["Hello", "Bonjour"], SamplingParams(max_tokens=8))

    ``client="mp"`` (default) runs the engine in child processes; ``client="inproc"`` runs the
    engine core in this process (imports torch here; for debugging).
    """

    def __init__(self, config: EngineConfig | None = None, *, client: str = "mp") -> None:
        self._client: SyncClient = make_sync_client(config, client)

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def client(self) -> SyncClient:
        """The blocking client underneath (``SyncMPClient``, or the in-process one)."""
        return self._client

    def generate(self, prompts: Prompt | Sequence[Prompt], params: ParamsArg = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """One final ``RequestOutput`` per prompt, in input order. A prompt is a string or a
        list of token ids (bytes are refused: ``PromptTypeError``, a ``TypeError`` and a
        ``ValueError``); every prompt and parameter is checked before any is sent. Ctrl-C
        (``KeyboardInterrupt``) aborts the batch's requests in the engine and propagates; the
        ``LLM`` stays usable."""
        batch = _as_batch(prompts)
        plist = _params_list(params, len(batch))
        prepared = [self._client.prepare(p, sp) for p, sp in zip(batch, plist, strict=True)]
        return self._run(prepared, use_tqdm)

    def chat(self, messages: Sequence[ChatMessage] | Sequence[Sequence[ChatMessage]],
             params: ParamsArg = None, use_tqdm: bool = True,
             **template_kwargs: Any) -> list[RequestOutput]:
        """Like ``generate`` for one conversation or a list of conversations."""
        if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
            raise ValueError("messages must be a conversation (a list of message dicts) or a "
                             "list of conversations")
        convs = [messages] if isinstance(messages[0], Mapping) else list(messages)
        plist = _params_list(params, len(convs))
        prepared = [self._client.prepare_chat(c, sp, **template_kwargs)  # type: ignore[arg-type]
                    for c, sp in zip(convs, plist, strict=True)]
        return self._run(prepared, use_tqdm)

    def _run(self, prepared: list[tuple[list[int], SamplingParams]],
             use_tqdm: bool) -> list[RequestOutput]:
        with tqdm(total=len(prepared), desc="Generating", unit="req",
                  disable=not use_tqdm) as bar:
            return self._client.generate_all(prepared, lambda: bar.update(1))

    def embed(self, inputs: EmbedInput | Sequence[EmbedInput], *, truncate: bool | int = True,
              dimensions: int | None = None) -> list[EmbeddingOutput]:
        """One ``EmbeddingOutput`` per input (a string or a list of token ids), in input order,
        from an embedding model (``AsyncMPClient.embed``); every input is checked before any
        is sent, and they run concurrently (the engine batches them)."""
        client = self._mp_client("embed")
        batch = _as_batch(inputs)
        ids = [client.async_client.prepare_embedding(x, truncate, dimensions) for x in batch]

        async def run() -> list[EmbeddingOutput]:
            results: list[EmbeddingOutput | None] = [None] * len(ids)

            async def one(i: int) -> None:
                results[i] = await client.async_client.embed_prepared(ids[i], dimensions)

            async with anyio.create_task_group() as tg:  # a failure cancels (aborts) the rest
                for i in range(len(ids)):
                    tg.start_soon(one, i)
            return results  # type: ignore[return-value]

        return client.call_async(run)

    def rerank(self, query: str, documents: Sequence[str], *, top_n: int | None = None,
               truncate: bool | int = True) -> list[RerankResult]:
        """``documents`` ordered by a reranker's relevance to ``query``, most relevant first
        (``AsyncMPClient.rerank``)."""
        client = self._mp_client("rerank")
        return client.call_async(functools.partial(client.async_client.rerank, query,
                                                   documents, top_n=top_n, truncate=truncate))

    def score(self, text_1: str, text_2: str, *, truncate: bool | int = True) -> ScoreOutput:
        """A reranker's relevance of ``text_2`` to ``text_1`` (``AsyncMPClient.score``)."""
        client = self._mp_client("score")
        return client.call_async(functools.partial(client.async_client.score, text_1, text_2,
                                                   truncate=truncate))

    def _mp_client(self, what: str) -> SyncMPClient:
        if not isinstance(self._client, SyncMPClient):
            raise ValueError(f"{what} runs on the engine's processes: use LLM(client='mp')")
        return self._client

    def get_stats(self) -> EngineStats:
        """A snapshot of the engine's scheduler and KV cache."""
        return self._client.get_stats()

    def shutdown(self) -> None:
        """Stop the engine and release every resource. Idempotent."""
        self._client.shutdown()


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray, memoryview)):
        # A Sequence of ints to Python: it would run as token ids (b"hi" -> [104, 105]).
        raise PromptTypeError(f"prompts must be a string or a list of token ids, got "
                              f"{type(prompts).__name__}; decode bytes to str first")
    if isinstance(prompts, Sequence) and prompts and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]  # type: ignore[arg-type]
    if not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a string, a list of token ids, or a non-empty list "
                         f"of those, got {prompts!r:.80}")
    return list(prompts)  # type: ignore[arg-type]


def _params_list(params: ParamsArg, n: int) -> list[SamplingParams | None]:
    if params is None or isinstance(params, SamplingParams):
        return [params] * n
    plist: list[SamplingParams | None] = list(params)
    if len(plist) != n:
        raise ValueError(f"got {len(plist)} SamplingParams for {n} prompts; pass one, or one "
                         "per prompt")
    return plist
