"""InprocClient: the engine core in the calling process, no children (for debugging: one
process to step through, profile, or break into). Importing this module does not import torch;
building the client does, since it loads the model here."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aioengine.client.chat_template import ChatMessage
from aioengine.client.inputs import Prompt, check_params, prompt_token_ids
from aioengine.client.outputs import RequestOutput
from aioengine.client.request_state import RequestState
from aioengine.client.tokenizer import Tokenizer
from aioengine.config import EngineConfig
from aioengine.hub import resolve_model
from aioengine.messages.engine_io import AddRequest, EngineStats
from aioengine.messages.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class InprocClient:
    def __init__(self, config: EngineConfig | None = None) -> None:
        from aioengine.engine.core import EngineCore  # the model (and torch) load here

        self.config = config if config is not None else EngineConfig()
        resolved = resolve_model(self.config.model, self.config.tokenizer, require_tokenizer=True)
        self._tokenizer = Tokenizer.from_dir(resolved.tokenizer_path)
        self.core = EngineCore(self.config)
        self._closed = False

    def __enter__(self) -> InprocClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        return int(self.core.max_model_len)

    def prepare(self, prompt: Prompt, params: SamplingParams | None
                ) -> tuple[list[int], SamplingParams]:
        self._check_open()
        tok = self._tokenizer
        return prompt_token_ids(tok, prompt, self.max_model_len), check_params(params,
                                                                               tok.vocab_size)

    def prepare_chat(self, messages: Sequence[ChatMessage], params: SamplingParams | None,
                     **template_kwargs: Any) -> tuple[list[int], SamplingParams]:
        return self.prepare(self._tokenizer.encode_chat(messages, **template_kwargs), params)

    def _add(self, ids: list[int], params: SamplingParams) -> RequestState:
        rid, now = uuid.uuid4().hex, time.time()
        detok = (None if self.config.detokenize_in == "engine"
                 else self._tokenizer.detokenizer(ids, params.skip_special_tokens))
        self.core.add_request(AddRequest(rid, ids, params, now))
        return RequestState(rid, ids, params, detok, now)

    def _step(self, states: dict[str, RequestState]) -> None:
        now = time.time()
        for delta in self.core.step():
            state = states.get(delta.request_id)
            if state is not None and state.apply(delta, now):
                self.core.abort([delta.request_id])  # a stop string ended it

    def generate_all(self, requests: Sequence[tuple[list[int], SamplingParams]],
                     on_finished: Callable[[], object] | None = None) -> list[RequestOutput]:
        self._check_open()
        order = [self._add(ids, params) for ids, params in requests]
        states = {s.request_id: s for s in order}
        pending = dict(states)
        results: dict[str, RequestOutput] = {}
        try:
            while pending:
                self._step(states)
                for rid in [r for r, s in pending.items() if s.finished]:
                    results[rid] = pending.pop(rid).take_output()
                    if on_finished is not None:
                        on_finished()
        finally:
            if pending:  # interrupted (KeyboardInterrupt, an error): free the engine's blocks
                self.core.abort(list(pending))
        return [results[s.request_id] for s in order]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None
               ) -> Iterator[RequestOutput]:
        """Step the engine and yield this request's outputs; closing the iterator aborts it."""
        state = self._add(*self.prepare(prompt, params))
        states = {state.request_id: state}
        try:
            while True:
                self._step(states)
                if state.has_news():
                    out = state.take_output()
                    yield out
                    if out.finished:
                        return
        finally:
            if not state.finished:
                self.core.abort([state.request_id])

    def get_stats(self) -> EngineStats:
        self._check_open()
        return self.core.get_stats()

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.core.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this InprocClient was shut down")
