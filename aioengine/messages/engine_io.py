"""Messages between the client (host) and the engine process.

Down (client -> engine) on the request channel: ``ClientMessage``.
Up (engine -> client) on the output channel: ``EngineMessage``.
Each channel has one typed msgspec decoder; tags select the variant.
"""

from __future__ import annotations

from typing import Any

import msgspec

from aioengine.messages.sampling_params import SamplingParams


class TokenLogprob(msgspec.Struct, array_like=True):
    """Log-probability of one sampled token plus the top-n alternatives at that position."""

    token_id: int
    """The sampled token."""
    logprob: float
    """Natural-log probability of ``token_id`` under the raw model logits."""
    top: list[tuple[int, float]] = msgspec.field(default_factory=list)
    """``(token_id, logprob)`` of the ``SamplingParams.logprobs`` most likely tokens."""


# ---- client -> engine ---------------------------------------------------------------------

class AddRequest(msgspec.Struct, tag="add"):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0  # lower value is scheduled first; FCFS within a priority
    eos_token_id: int | None = None
    # An embedding request: the prompt runs whole in one step and the answer is its pooled
    # vector (the model's pooling), no tokens; ``params`` is then unused.
    pooling: bool = False
    # A pooling request's text pair: its second text starts at this position (token type 1
    # from here, as BERT was trained on pairs); 0: one text.
    pair_start: int = 0


class AbortRequests(msgspec.Struct, tag="abort"):
    request_ids: list[str]


class UtilityCall(msgspec.Struct, tag="call"):
    """``get_stats``, ``reset_prefix_cache``, ``ping``; the reply carries the same ``call_id``."""

    call_id: int
    method: str
    args: list[Any] = msgspec.field(default_factory=list)


ClientMessage = AddRequest | AbortRequests | UtilityCall


# ---- engine -> client ---------------------------------------------------------------------

class RequestDelta(msgspec.Struct, omit_defaults=True):
    """What one request produced in one engine step."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_token_id: int | None = None
    num_cached_tokens: int = 0
    error: str | None = None  # set with finish_reason "error"
    first_scheduled_time: float | None = None
    new_text: str | None = None  # only when the engine detokenizes (detokenize_in="engine")
    embedding: list[float] | None = None  # a pooling request's answer, with its finish


class StepOutputs(msgspec.Struct, tag="outputs"):
    outputs: list[RequestDelta]
    timestamp: float


class UtilityResult(msgspec.Struct, tag="result"):
    call_id: int
    result: Any = None
    error: str | None = None


class EngineFailure(msgspec.Struct, tag="failure"):
    """Sent once, best effort, before the engine exits through ERROR."""

    message: str
    traceback: str = ""


EngineMessage = StepOutputs | UtilityResult | EngineFailure


class ProcessMemory(msgspec.Struct, kw_only=True):
    """The resident memory of one process of the engine's tree (``EngineStats.processes``)."""

    role: str
    """``host`` (the client's process), ``engine``, or a worker's name (``worker-0``)."""
    pid: int
    rss_bytes: int
    """Resident set size (psutil ``memory_info().rss``)."""


class EngineStats(msgspec.Struct, kw_only=True):
    """A snapshot of the engine's scheduler and KV cache (``get_stats()``)."""

    num_running: int
    """Requests in the running batch."""
    num_waiting: int
    """Requests waiting to be admitted (new or preempted)."""
    num_preempted_total: int
    """Preemptions since start."""
    kv_blocks_used: int
    """KV-cache blocks held by requests."""
    kv_blocks_total: int
    """KV-cache blocks in the engine."""
    prefix_cache_hit_rate: float
    """Fraction of admitted prompt tokens found in the prefix cache."""
    prompt_tokens_total: int
    """Prompt tokens of every request admitted since start."""
    generation_tokens_total: int
    """Tokens sampled since start."""
    num_requests_finished_total: int = 0
    """Requests finished (any reason) since start."""
    kv_bytes_reserved: int = 0
    """Bytes of the KV cache, allocated (and on CPU written) at start, over all ranks."""
    kv_bytes_used: int = 0
    """Bytes of the blocks held by requests (``kv_blocks_used``)."""
    kv_bytes_prefix_cached: int = 0
    """Bytes of the blocks no request holds that keep a cached prompt prefix (reusable, and
    evicted first when blocks run short)."""
    processes: list[ProcessMemory] = msgspec.field(default_factory=list)
    """Resident memory of each process of the tree: the engine and its workers, and the host
    when the stats come from a client."""
    data_parallel_size: int = 1
    """Engine replicas behind the client (``EngineConfig.data_parallel_size``)."""
    replicas_alive: int = 1
    """Replicas serving; fewer than ``data_parallel_size`` only with
    ``replica_failure="degrade"`` after a replica died."""
    replicas: list[EngineStats | None] | None = None
    """With data parallelism: each replica's own snapshot (``None`` for a dead one); the fields
    above are then their total."""
