"""LLM: the synchronous API for batch work (public API)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from aioengine.client.chat_template import ChatMessage
from aioengine.client.factory import SyncClient, make_sync_client
from aioengine.client.inputs import Prompt, PromptTypeError
from aioengine.client.outputs import RequestOutput
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
