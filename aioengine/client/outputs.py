"""What a stream yields: ``RequestOutput`` (public API) and its ``RequestMetrics``."""

from __future__ import annotations

from dataclasses import dataclass, field

from aioengine.messages.engine_io import TokenLogprob


@dataclass(slots=True)
class RequestMetrics:
    """Timestamps (``time.time()`` seconds) of one request, seen from the client. The object is
    shared by every output of its request and is complete once the request has finished."""

    arrival_time: float
    """When the client accepted the request."""
    first_scheduled_time: float | None = None
    """When the engine first put it in a step (reported by the engine)."""
    first_token_time: float | None = None
    """When its first output token reached the client."""
    last_token_time: float | None = None
    """When its latest output tokens reached the client."""
    finished_time: float | None = None
    """When it finished, for any reason."""
    inter_token_latencies: list[float] = field(default_factory=list)
    """Seconds between successive arrivals of new tokens after the first."""

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from arrival to the first token; None before it."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        """Seconds from arrival to the finish; None while running."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def mean_inter_token_latency(self) -> float | None:
        """Mean of ``inter_token_latencies``; None with fewer than two token arrivals."""
        itl = self.inter_token_latencies
        return sum(itl) / len(itl) if itl else None

    def on_tokens(self, now: float) -> None:
        """Record that new tokens arrived at ``now`` (called by the client)."""
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
    """The id given to ``generate`` (or a generated one)."""
    prompt_token_ids: list[int]
    """The prompt as token ids (after the chat template, for ``chat``)."""
    token_ids: list[int]
    """Every output token so far."""
    text: str
    """The output text so far (a possible start of a stop string is held back until it is
    decided)."""
    delta_token_ids: list[int]
    """Output tokens new since this consumer's previous output."""
    delta_text: str
    """Text new since this consumer's previous output."""
    finished: bool
    """True on the last output of the stream."""
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None
    """``stop`` (eos, a stop token id or a stop string), ``length`` (``max_tokens`` or the
    context length), ``abort``, ``error``; None while running."""
    metrics: RequestMetrics
    """Timestamps and latencies of the request, seen from the client."""
    logprobs: list[TokenLogprob] | None = None
    """Cumulative, one per token in ``token_ids``, when ``SamplingParams.logprobs`` is set."""
    num_cached_tokens: int = 0
    """Prompt tokens whose KV was found in the prefix cache."""
    stop_reason: str | int | None = None
    """The stop string or stop token id that finished the request, if any."""
    error: str | None = None
    """The engine's message when ``finish_reason`` is "error"."""
    embedding: list[float] | None = None
    """An embedding request's pooled vector, on its last output."""
