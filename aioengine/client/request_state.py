"""One request's state in the client: detokenization, stop strings, and what the consumer has
seen. The producer (the output task) only updates it; the consumer builds a ``RequestOutput``
from it when it wakes, so a lagging consumer merges steps for free and never blocks anyone."""

from __future__ import annotations

from aioengine.client.outputs import RequestMetrics, RequestOutput
from aioengine.client.stop import StopStrings
from aioengine.messages.engine_io import RequestDelta, TokenLogprob
from aioengine.messages.sampling_params import SamplingParams
from aioengine.text.detokenize import IncrementalDetokenizer


class RequestState:
    __slots__ = ("_detok", "_released", "_seen_text", "_seen_tokens", "_stop", "embedding",
                 "error",
                 "final_taken", "finish_reason", "logprobs", "metrics", "num_cached_tokens",
                 "output_ids", "params", "prompt_token_ids", "request_id", "stop_reason", "text")

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 detokenizer: IncrementalDetokenizer | None, arrival_time: float) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self._detok = detokenizer  # None when text comes from the engine (new_text)
        self._stop = StopStrings(params.stop, params.include_stop_str_in_output)
        self.output_ids: list[int] = []
        self.text = ""
        self._released = 0  # chars of ``text`` a consumer may see (the rest may start a stop)
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None
        self.num_cached_tokens = 0
        self.embedding: list[float] | None = None
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self._seen_tokens = 0
        self._seen_text = 0
        self.final_taken = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    # ---- producer side -------------------------------------------------------------------
    def apply(self, delta: RequestDelta, now: float) -> bool:
        """Fold one engine delta in. Returns True when a stop string finished the request here,
        so the engine must be told to abort it."""
        if self.finished:
            return False
        if delta.first_scheduled_time is not None and self.metrics.first_scheduled_time is None:
            self.metrics.first_scheduled_time = delta.first_scheduled_time
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        if delta.embedding is not None:
            self.embedding = delta.embedding
        ids = delta.new_token_ids
        if ids:
            self.metrics.on_tokens(now)
        stopped = False
        if self._detok is None:
            self._add_tokens(ids, delta.new_logprobs)
            stopped = self._add_text(delta.new_text or "")
        elif self._stop and ids:
            # Token by token, so the ids stop exactly where the stop string completed.
            for i, tok in enumerate(ids):
                self._add_tokens([tok], delta.new_logprobs[i:i + 1] if delta.new_logprobs
                                 else None)
                if self._add_text(self._detok.step([tok])):
                    stopped = True
                    break
        else:
            self._add_tokens(ids, delta.new_logprobs)
            self._add_text(self._detok.step(ids) if ids else "")
        if not stopped and delta.finish_reason is not None:
            if self._detok is not None:
                stopped = self._add_text(self._detok.flush())
            if not stopped:
                self.finish_reason = delta.finish_reason
                self.error = delta.error
                if delta.stop_token_id is not None:
                    self.stop_reason = delta.stop_token_id
        if self.finished:
            self._released = len(self.text)
            self.metrics.finished_time = now
        else:
            self._released = len(self.text) - self._stop.holdback(self.text)
        return stopped

    def _add_tokens(self, ids: list[int], logprobs: list[TokenLogprob] | None) -> None:
        self.output_ids.extend(ids)
        if self.logprobs is not None and logprobs:
            self.logprobs.extend(logprobs)

    def _add_text(self, piece: str) -> bool:
        if not piece:
            return False
        start = len(self.text)
        self.text += piece
        # Stop strings count only once min_tokens have been produced, as stop tokens do.
        if not self._stop or len(self.output_ids) < self.params.min_tokens:
            return False
        hit = self._stop.find(self.text, start)
        if hit is None:
            return False
        keep, stop = hit
        self.text = self.text[:keep]
        self.finish_reason = "stop"
        self.stop_reason = stop
        return True

    def fail(self, reason: str, error: str | None, now: float) -> None:
        """Finish from outside the engine's outputs (abort by the client, engine error)."""
        if self.finished:
            return
        self.finish_reason = reason
        self.error = error
        self._released = len(self.text)
        self.metrics.finished_time = now

    # ---- consumer side -------------------------------------------------------------------
    def has_news(self) -> bool:
        return (len(self.output_ids) > self._seen_tokens or self._released > self._seen_text
                or (self.finished and not self.final_taken))

    def take_output(self) -> RequestOutput:
        ids = self.output_ids
        delta_ids = ids[self._seen_tokens:]
        delta_text = self.text[self._seen_text:self._released]
        self._seen_tokens = len(ids)
        self._seen_text = self._released
        if self.finished:
            self.final_taken = True
        return RequestOutput(
            request_id=self.request_id, prompt_token_ids=self.prompt_token_ids,
            token_ids=list(ids), text=self.text[:self._released], delta_token_ids=delta_ids,
            delta_text=delta_text, finished=self.finished, finish_reason=self.finish_reason,
            metrics=self.metrics,
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
            num_cached_tokens=self.num_cached_tokens, stop_reason=self.stop_reason,
            error=self.error, embedding=self.embedding)
