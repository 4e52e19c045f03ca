"""Per-request state inside the engine: tokens, sampling controls, status and timestamps."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aioengine.messages.sampling_params import SamplingParams

if TYPE_CHECKING:
    from aioengine.structured import GrammarMatcher


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again after its blocks were taken (recompute on resume)
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # eos or a stop token id
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"
    ERROR = "error"


@dataclass(eq=False)
class Request:
    """One generation request. ``token_ids`` holds the prompt followed by the output so far;
    ``num_computed_tokens`` of them have their KV in the cache (``block_ids``)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0
    eos_token_ids: tuple[int, ...] = ()  # any of these ends generation (unless ignore_eos)
    seq: int = 0  # admission order: FCFS tie-break within a priority, newest preempted first
    # An embedding request: scheduled whole, in one step, outside the prefix cache; finished
    # by its pooled vector.
    pooling: bool = False
    pair_start: int = 0  # a pooled text pair's second text starts here

    token_ids: list[int] = field(init=False)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    error: str | None = None

    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    # Leading blocks released because they fell wholly out of a sliding window: their
    # ``block_ids`` entries are placeholders (block 0; never read, masked out).
    num_window_freed: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit on the first admission
    num_preemptions: int = 0

    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    reported_first: bool = False  # the first delta (with cache hits, timestamps) went out
    # Structured outputs: this request's position in its grammar (advanced by every sampled
    # token); None for an unconstrained request.
    grammar: GrammarMatcher | None = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def sort_key(self) -> tuple[int, int]:
        """Lower sorts first: smaller priority value, then older."""
        return (self.priority, self.seq)

    def finish(self, reason: FinishReason, *, error: str | None = None,
               stop_token_id: int | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.error = error
        self.stop_token_id = stop_token_id
        self.finished_time = time.time()
