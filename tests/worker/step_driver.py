"""A minimal engine stand-in for worker tests: builds real ``StepInput``s (chunked prefill,
decode, preemption by recompute) and applies ``StepResult``s, with a bump block allocator."""

from __future__ import annotations

from dataclasses import dataclass, field

from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import (
    NewSequence,
    ScheduledChunk,
    StepInput,
    StepResult,
)


@dataclass
class Seq:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    outputs: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is in the cache
    blocks: list[int] = field(default_factory=list)
    announced: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.outputs


class StepDriver:
    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.next_block = 0
        self.seqs: dict[str, Seq] = {}
        self.finished: list[str] = []
        self.step_id = 0

    def add(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        self.seqs[request_id] = Seq(request_id, list(prompt), params)

    def preempt(self, request_id: str) -> None:
        """Drop the KV and the worker state; the request re-enters with its outputs."""
        seq = self.seqs[request_id]
        seq.computed, seq.blocks, seq.announced = 0, [], False
        self.finished.append(request_id)

    def finish(self, request_id: str) -> Seq:
        self.finished.append(request_id)
        return self.seqs.pop(request_id)

    def _grow(self, seq: Seq, upto: int) -> None:
        need = -(-upto // self.block_size)
        while len(seq.blocks) < need:
            if self.next_block >= self.num_blocks:
                raise RuntimeError("test driver ran out of KV blocks")
            seq.blocks.append(self.next_block)
            self.next_block += 1

    def step(self, budget: dict[str, int] | None = None) -> StepInput:
        """One chunk for each listed request (all by default): up to ``budget[rid]`` prompt
        tokens while prefilling, else one decode token. A budget of 0 skips the request."""
        new, chunks = [], []
        for rid, seq in self.seqs.items():
            want = 10**9 if budget is None else budget.get(rid, 0)
            if want == 0:
                continue
            if not seq.announced:
                new.append(NewSequence(rid, list(seq.prompt), list(seq.outputs), seq.params))
                seq.announced = True
            tokens = seq.tokens
            n = min(want, len(tokens) - seq.computed)
            start = seq.computed
            self._grow(seq, start + n)
            chunks.append(ScheduledChunk(rid, tokens[start:start + n], start, list(seq.blocks),
                                         start + n == len(tokens)))
            seq.computed += n
        step = StepInput(self.step_id, new, chunks, self.finished)
        self.finished = []
        self.step_id += 1
        return step

    def apply(self, result: StepResult) -> None:
        for s in result.sampled:
            self.seqs[s.request_id].outputs.append(s.token_id)
