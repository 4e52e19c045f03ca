"""The ``bare_loop`` row of the ``overhead`` suite: ``ModelRunner.execute`` (model + sampler)
called directly in one process, with no engine, scheduler, client or transport around it.

The host drives it as a child (``python -m aioengine.bench.bare_loop SPEC_JSON``) over its
stdin/stdout, one line per request, so the host never imports torch and the loop can be timed
in turns with the engines (round-robin repeats spread the box's background noise evenly):

    child -> "ready"                 after loading the model and a warm-up request
    host  -> "go"   child -> RESULT  one timed greedy request; RESULT is a JSON line
    host  -> "quit" (or EOF)         the child exits
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

MARK = "BARE-LOOP "
BLOCK_SIZE = 16


@dataclass(frozen=True)
class DecodeTiming:
    """One greedy request, timed the same way on every side of the ``overhead`` suite."""

    tokens: int  # output tokens produced (counted)
    first_tokens: int  # tokens in the first output (1, unless a lagging consumer merged some)
    first_token_s: float  # perf_counter when the first output arrived
    last_token_s: float  # ... and the last

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first output per second after it: the decode rate, prefill and
        start-up excluded."""
        span = self.last_token_s - self.first_token_s
        decoded = self.tokens - self.first_tokens
        if decoded < 1 or span <= 0:
            raise ValueError(f"a decode rate needs tokens after the first output over a "
                             f"positive time, got {decoded} tokens in {span} s")
        return decoded / span


class BareLoopChild:
    """The host's handle on the child process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, model: str, prompt: list[int], new_tokens: int,
                    threads: int | None) -> BareLoopChild:
        spec = json.dumps({"model": model, "prompt": prompt, "new_tokens": new_tokens,
                           "threads": threads})
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aioengine.bench.bare_loop", spec,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        return cls(proc)

    async def _line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            assert self.proc.stderr is not None
            err = (await self.proc.stderr.read()).decode(errors="replace")
            raise RuntimeError(f"the bare loop child exited (code {await self.proc.wait()}):"
                               f"\n{err[-4000:]}")
        return line.decode().strip()

    async def ready(self, timeout: float) -> None:
        line = await self._line(timeout)
        if line != "ready":
            raise RuntimeError(f"the bare loop child said {line!r} instead of 'ready'")

    async def measure(self, timeout: float) -> DecodeTiming:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        line = await self._line(timeout)
        if not line.startswith(MARK):
            raise RuntimeError(f"the bare loop child said {line!r} instead of a result")
        return DecodeTiming(**json.loads(line[len(MARK):]))

    async def close(self) -> None:
        if self.proc.returncode is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"quit\n")
                await self.proc.stdin.drain()
                await asyncio.wait_for(self.proc.wait(), 30)
            except (OSError, TimeoutError):
                self.proc.kill()
                await self.proc.wait()


# ---- the child: everything below runs with torch imported -----------------------------------

class _Loop:
    def __init__(self, model: str, prompt: list[int], new_tokens: int,
                 threads: int | None) -> None:
        from aioengine.config import EngineConfig
        from aioengine.worker.model_runner import ModelRunner

        blocks = -(-(len(prompt) + new_tokens) // BLOCK_SIZE)
        config = EngineConfig(model=model, block_size=BLOCK_SIZE, num_kv_blocks=blocks,
                              max_num_seqs=1, num_threads=threads)
        self.runner = ModelRunner(config)  # applies the engine's thread policy, as a worker
        self.runner.allocate_kv_cache(blocks)
        self.table = list(range(blocks))
        self.prompt = prompt
        self.new_tokens = new_tokens
        self.step_id = 0
        self.request = 0

    def _step(self, new: list[Any], chunks: list[Any], finished: list[str]) -> list[int]:
        from aioengine.messages.worker_io import StepInput

        self.step_id += 1
        res = self.runner.execute(StepInput(self.step_id, new, chunks, finished))
        return [s.token_id for s in res.sampled]

    def one_request(self) -> DecodeTiming:
        """Prefill, then one decode step per token, exactly as the engine would feed them."""
        from aioengine.messages.sampling_params import SamplingParams
        from aioengine.messages.worker_io import NewSequence, ScheduledChunk

        self.request += 1
        rid = f"bare-{self.request}"
        params = SamplingParams(max_tokens=self.new_tokens, temperature=0.0, ignore_eos=True)
        prompt = self.prompt
        out = self._step([NewSequence(rid, prompt, [], params)],
                         [ScheduledChunk(rid, prompt, 0, self.table, True)], [])
        first = time.perf_counter()
        tokens = list(out)
        while len(tokens) < self.new_tokens:
            pos = len(prompt) + len(tokens) - 1
            tokens += self._step([], [ScheduledChunk(rid, [tokens[-1]], pos, self.table,
                                                     True)], [])
        last = time.perf_counter()
        self._step([], [], [rid])
        return DecodeTiming(len(tokens), 1, first, last)


def _child(arg: str) -> None:
    spec = json.loads(arg)
    loop = _Loop(spec["model"], spec["prompt"], spec["new_tokens"], spec["threads"])
    loop.one_request()  # warm-up
    gc.freeze()  # as the engine and worker processes do after start-up
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t = loop.one_request()
        print(MARK + json.dumps(asdict(t)), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1])
