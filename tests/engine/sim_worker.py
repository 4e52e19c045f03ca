"""A synthetic worker for driving the real scheduler without a model.

It keeps a paged "KV cache" like the real runner: the value stored at position p is a hash of
the token at p and the value at p-1, read back through the block table, so a wrong block table,
a wrong prefix-cache hit or a missing prefill changes every later value. The sampled token is
derived from the last value, so outputs depend on the whole sequence exactly as a causal model's
greedy output does. ``reference`` computes what one request alone must produce.
"""

from __future__ import annotations

from aioengine.messages import SampledToken, StepInput, StepResult
from aioengine.messages.worker_io import PooledOutput

VOCAB = 97
_MASK = (1 << 61) - 1


def _kv(prev: int, token: int) -> int:
    return (prev * 1_000_003 + token * 7919 + 1) & _MASK


def _next_token(kv: int) -> int:
    return (kv >> 7) % VOCAB


def reference(prompt: list[int], max_tokens: int, *, eos: int | None = None,
              stop_ids: tuple[int, ...] = (), max_model_len: int = 10**9) -> list[int]:
    kv, out = 0, []
    for t in prompt:
        kv = _kv(kv, t)
    while True:
        t = _next_token(kv)
        out.append(t)
        if t == eos or t in stop_ids or len(out) >= max_tokens \
                or len(prompt) + len(out) >= max_model_len:
            return out
        kv = _kv(kv, t)


class SimWorker:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.cache: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]
        self.seqs: dict[str, list[int]] = {}  # tokens the worker knows of each live sequence
        self.tokens_computed = 0

    def _slot(self, table: list[int], pos: int) -> tuple[int, int]:
        return table[pos // self.block_size], pos % self.block_size

    def execute(self, step: StepInput) -> StepResult:
        for rid in step.finished_ids:
            self.seqs.pop(rid, None)
        for seq in step.new_sequences:
            assert seq.request_id not in self.seqs, f"{seq.request_id} started twice"
            self.seqs[seq.request_id] = list(seq.prompt_token_ids) + list(seq.output_token_ids)
        sampled, pooled = [], []
        for chunk in step.chunks:
            known = self.seqs[chunk.request_id]
            start, n = chunk.start_pos, len(chunk.token_ids)
            assert known[start:start + n] == chunk.token_ids, "chunk disagrees with the sequence"
            assert len(chunk.block_table) * self.block_size >= start + n, "block table too short"
            if start:
                b, o = self._slot(chunk.block_table, start - 1)
                prev = self.cache[b][o]
                assert prev is not None, f"{chunk.request_id}: position {start - 1} not computed"
            else:
                prev = 0
            for i, t in enumerate(chunk.token_ids):
                prev = _kv(prev, t)
                b, o = self._slot(chunk.block_table, start + i)
                self.cache[b][o] = prev
            self.tokens_computed += n
            if chunk.pool:  # an embedding input: whole, never sampled; answers its last value
                assert start == 0 and n == len(known) and not chunk.sample
                pooled.append(PooledOutput(chunk.request_id, [float(prev % 1000)]))
                continue
            assert chunk.sample == (start + n == len(known))
            if chunk.sample:
                tok = _next_token(prev)
                known.append(tok)
                sampled.append(SampledToken(chunk.request_id, tok))
        return StepResult(step.step_id, sampled, pooled)


def make_request(rid: str, prompt: list[int], max_tokens: int = 8, *, priority: int = 0,
                 eos: int | None = None, pooling: bool = False, **params):
    from aioengine.engine.request import Request
    from aioengine.messages import SamplingParams

    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                     **params),
                   arrival_time=0.0, priority=priority,
                   eos_token_ids=() if eos is None else (eos,), pooling=pooling)


def pooled_value(prompt: list[int]) -> float:
    """What ``SimWorker`` answers for an embedding input."""
    kv = 0
    for t in prompt:
        kv = _kv(kv, t)
    return float(kv % 1000)


def drive(sched, worker: SimWorker, max_steps: int = 10_000) -> dict[str, list[int]]:
    """Step until nothing is left; return every request's streamed tokens."""
    out: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not sched.has_unfinished:
            return out
        step = sched.schedule()
        for delta in sched.update(step, worker.execute(step)):
            out.setdefault(delta.request_id, []).extend(delta.new_token_ids)
    raise AssertionError(f"still unfinished after {max_steps} steps")
