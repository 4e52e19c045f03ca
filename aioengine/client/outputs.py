"""What a stream yields: ``RequestOutput`` (public API) and its ``RequestMetrics``."""

from __future__ import annotations

from dataclasses import dataclass, field

from aioengine.messages.engine_io import TokenLogprob


@dataclass(slots=True)
class RequestMetrics:
    """Timestamps (``time.time()`` seconds) of one request, seen from the client. The object is
    shared by every output of its request and is complete once the request has finished."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    inter_token_latencies: list[float] = field(default_factory=list)
    """Seconds between successive arrivals of new tokens after the first."""

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def mean_inter_token_latency(self) -> float | None:
        itl = self.inter_token_latencies
        return sum(itl) / len(itl) if itl else None

    def on_tokens(self, now: float) -> None:
        if self.first_token_time is None:
            self.first_token_time = now
        elif self.last_token_time is not None:
            self.inter_token_latencies.append(now - self.last_token_time)
        self.last_token_time = now


@dataclass(slots=True)
class RequestOutput:
    """One step of a stream: cumulative ``token_ids``/``text`` and what is new since the last
    output this consumer saw (``delta_*``). When a consumer lags, several engine steps merge
    into one output, so the deltas always concatenate to the cumulative fields."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    delta_token_ids: list[int]
    delta_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None
    metrics: RequestMetrics
    logprobs: list[TokenLogprob] | None = None
    """Cumulative, one per token in ``token_ids``, when ``SamplingParams.logprobs`` is set."""
    num_cached_tokens: int = 0
    stop_reason: str | int | None = None
    """The stop string or stop token id that finished the request, if any."""
    error: str | None = None
    """The engine's message when ``finish_reason`` is "error"."""
