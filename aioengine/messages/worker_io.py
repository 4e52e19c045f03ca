"""Messages between the engine process and its worker processes.

Down: one ``StepInput`` per engine step, broadcast to every rank (or ``WorkerCall``).
Up: rank 0 answers each with a ``StepResult`` (or ``WorkerCallResult``); any rank that raises
answers with a ``WorkerError`` carrying its traceback.
"""

from __future__ import annotations

from typing import Any

import msgspec

from aioengine.messages.engine_io import TokenLogprob
from aioengine.messages.sampling_params import SamplingParams


class NewSequence(msgspec.Struct, array_like=True):
    """Sent once when a request (re)enters the running set; the worker keeps sampling state
    (params, seed, tokens so far for penalties) until it sees the id in ``finished_ids``."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # non-empty when resumed after preemption
    params: SamplingParams
    # The request's own eos ids (AddRequest.eos_token_id), masked during ``min_tokens``;
    # None: the model's eos ids.
    eos_token_ids: list[int] | None = None


PREVIOUS_TOKEN = -1
"""A decode chunk's token id ``[PREVIOUS_TOKEN]`` stands for the token this rank sampled last for
the sequence: the engine schedules a step before the previous one's result is back (one step
ahead; one rank only, since only the driver rank samples)."""


class ScheduledChunk(msgspec.Struct, array_like=True):
    """Tokens of one sequence to run this step: a prefill chunk or one decode token."""

    request_id: str
    token_ids: list[int]  # the tokens whose KV to compute, at positions start_pos...
    # (or ``[PREVIOUS_TOKEN]``: see there)
    start_pos: int
    block_table: list[int]  # all of the sequence's blocks so far (covering start_pos+len-1)
    sample: bool  # True when the last token of this chunk is the last known token
    pool: bool = False  # a pooling request's whole prompt: answer its pooled hidden state
    pair_start: int = 0  # a pooled pair's second text starts here (token type 1); 0: one text


class GrammarBitmask(msgspec.Struct, array_like=True):
    """Which tokens each constrained row may sample this step (structured outputs): one bit
    per token id, little-endian within 32-bit words, ``words`` words per row, rows in the
    order of ``rows``."""

    rows: list[int]  # indices into this step's sampling chunks (those with sample=True)
    words: int
    data: bytes  # len(rows) * words * 4 bytes


class StepInput(msgspec.Struct, tag="step"):
    step_id: int
    new_sequences: list[NewSequence]
    chunks: list[ScheduledChunk]
    finished_ids: list[str]  # drop sampling state (finished, aborted, or preempted)
    bitmask: GrammarBitmask | None = None  # the rows a grammar constrains this step


class WorkerCall(msgspec.Struct, tag="call"):
    """Control: ``shutdown``, ``profile_memory``, ``ping``."""

    call_id: int
    method: str
    args: list[Any] = msgspec.field(default_factory=list)


WorkerInbound = StepInput | WorkerCall


class SampledToken(msgspec.Struct, array_like=True):
    request_id: str
    token_id: int
    logprob: TokenLogprob | None = None


class PooledOutput(msgspec.Struct, array_like=True):
    request_id: str
    embedding: list[float]  # the pooled vector, or a classifier's logits (a reranker's score)


class StepResult(msgspec.Struct, tag="step"):
    step_id: int
    sampled: list[SampledToken]  # one per chunk with sample=True, in chunk order
    pooled: list[PooledOutput] = msgspec.field(default_factory=list)  # one per pool chunk


class WorkerCallResult(msgspec.Struct, tag="result"):
    call_id: int
    result: Any = None


class WorkerError(msgspec.Struct, tag="error"):
    rank: int
    exc_type: str
    message: str
    traceback: str
    fatal: bool = True  # False: the frame was rejected (malformed, unknown call); worker lives on


WorkerOutbound = StepResult | WorkerCallResult | WorkerError
