"""The ``kernels`` suite: our ModelRunner against Hugging Face transformers on the same weights.

Metrics (names ``aioengine`` and ``hf_transformers``, the baseline):

- ``decode_step_ms_b{1,8,32}``: median time of one decode step of a batch (our full
  ``execute``: host-side batch build, forward, logits, greedy sampling; HF: one forward with its
  KV cache plus the argmax);
- ``prefill_tokens_per_s``: prompt tokens per second of one step of several whole prompts;
- ``weight_gbytes_per_s_b1`` and ``mem_bw_fraction_b1``: weight bytes a batch-1 decode step
  must read (every parameter but the input embedding, whose single row is negligible, unless
  tied to the LM head) per second of step time, as a fraction of the ``memcpy`` row's measured
  copy bandwidth (bytes read + written per second, as STREAM counts a copy).

The measurement runs in a child interpreter (``python -m aioengine.bench.kernels JSON``), so
the bench host never imports torch and the models' memory is returned when it exits.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from aioengine.bench.options import BenchOptions
from aioengine.bench.results import Result

SUITE = "kernels"
BASELINE = "hf_transformers"
OURS = "aioengine"
NAMES = (OURS, BASELINE)
MARK = "KERNELS-RESULTS "
CHILD_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Sizes:
    batches: tuple[int, ...]
    prompt_len: int  # context before the timed decode steps
    decode_steps: int
    warmup: int
    prefill_seqs: int
    prefill_len: int
    prefill_reps: int
    memcpy_mib: int


FULL = Sizes(batches=(1, 8, 32), prompt_len=256, decode_steps=50, warmup=5, prefill_seqs=4,
             prefill_len=512, prefill_reps=5, memcpy_mib=512)
QUICK = Sizes(batches=(1, 8, 32), prompt_len=32, decode_steps=8, warmup=2, prefill_seqs=2,
              prefill_len=128, prefill_reps=2, memcpy_mib=64)


def run(options: BenchOptions) -> list[Result]:
    sizes = QUICK if options.quick else FULL
    arg = json.dumps({"model": options.model, "names": [n for n in NAMES if options.wants(n)],
                      "sizes": asdict(sizes)})
    proc = subprocess.run([sys.executable, "-m", "aioengine.bench.kernels", arg],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"kernels bench child failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return [Result(SUITE, *row) for row in json.loads(lines[-1][len(MARK):])]


# ---- the child: everything below runs with torch imported ------------------------------------

def _measure(model: str, names: list[str], sizes: Sizes) -> list[tuple[str, str, float, str]]:
    import torch

    from aioengine.config import EngineConfig
    from aioengine.worker.model_runner import ModelRunner

    torch.manual_seed(0)
    block = 16
    longest = max(sizes.prompt_len + sizes.warmup + sizes.decode_steps + 1, sizes.prefill_len)
    per_seq = -(-longest // block)
    seqs = max(max(sizes.batches), sizes.prefill_seqs)
    config = EngineConfig(model=model, block_size=block, num_kv_blocks=seqs * per_seq,
                          max_num_seqs=seqs)
    runner = ModelRunner(config)
    runner.allocate_kv_cache(seqs * per_seq)
    device, vocab = runner.device, runner.spec.vocab_size
    rows: list[tuple[str, str, float, str]] = []
    copy_bw = _memcpy_gbytes_per_s(device, sizes.memcpy_mib)
    rows.append(("memcpy", "gbytes_per_s", copy_bw, "GB/s"))

    models: list[tuple[str, Any]] = []
    if OURS in names:
        models.append((OURS, _OurModel(runner, per_seq)))
    if BASELINE in names:
        models.append((BASELINE, _HFModel(runner)))
    for name, m in models:
        weights = m.weight_bytes()
        for b in sizes.batches:
            prompts = torch.randint(0, vocab, (b, sizes.prompt_len)).tolist()
            ms = m.decode_ms(prompts, sizes.warmup, sizes.decode_steps)
            rows.append((name, f"decode_step_ms_b{b}", ms, "ms"))
            if b == 1:
                gbs = weights / (ms / 1000) / 1e9
                rows.append((name, "weight_gbytes_per_s_b1", gbs, "GB/s"))
                rows.append((name, "mem_bw_fraction_b1", gbs / copy_bw, "fraction"))
        prompts = torch.randint(0, vocab, (sizes.prefill_seqs, sizes.prefill_len)).tolist()
        rows.append((name, "prefill_tokens_per_s", m.prefill_tokens_per_s(
            prompts, sizes.prefill_reps), "tok/s"))
    return rows


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _memcpy_gbytes_per_s(device: Any, mib: int) -> float:
    import torch

    src = torch.ones(mib * 1024 * 1024 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / statistics.median(times[1:]) / 1e9


def _weight_bytes(module: Any, input_embedding: Any, tied: bool) -> int:
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    if not tied:
        total -= input_embedding.numel() * input_embedding.element_size()
    return total


class _OurModel:
    def __init__(self, runner: Any, per_seq: int) -> None:
        self.runner = runner
        self.per_seq = per_seq
        self.step_id = 0

    def weight_bytes(self) -> int:
        m = self.runner.model
        return _weight_bytes(m, m.embed_tokens.weight, m.lm_head is None)

    def _step(self, new: list[Any], chunks: list[Any], finished: list[str]) -> Any:
        from aioengine.messages.worker_io import StepInput

        self.step_id += 1
        return self.runner.execute(StepInput(self.step_id, new, chunks, finished))

    def decode_ms(self, prompts: list[list[int]], warmup: int, steps: int) -> float:
        from aioengine.messages.sampling_params import SamplingParams
        from aioengine.messages.worker_io import NewSequence, ScheduledChunk

        greedy = SamplingParams(temperature=0.0, max_tokens=warmup + steps + 1)
        ids = [f"d{self.step_id}-{i}" for i in range(len(prompts))]
        tables = [list(range(i * self.per_seq, (i + 1) * self.per_seq))
                  for i in range(len(prompts))]
        res = self._step([NewSequence(r, p, [], greedy) for r, p in zip(ids, prompts,
                                                                        strict=True)],
                         [ScheduledChunk(r, p, 0, t, True)
                          for r, p, t in zip(ids, prompts, tables, strict=True)], [])
        last = [s.token_id for s in res.sampled]
        pos = len(prompts[0])
        times = []
        for _ in range(warmup + steps):
            chunks = [ScheduledChunk(r, [tok], pos, t, True)
                      for r, tok, t in zip(ids, last, tables, strict=True)]
            t0 = time.perf_counter()
            res = self._step([], chunks, [])  # returns host ints: already synchronised
            times.append(time.perf_counter() - t0)
            last = [s.token_id for s in res.sampled]
            pos += 1
        self._step([], [], ids)
        return statistics.median(times[warmup:]) * 1000

    def prefill_tokens_per_s(self, prompts: list[list[int]], reps: int) -> float:
        from aioengine.messages.sampling_params import SamplingParams
        from aioengine.messages.worker_io import NewSequence, ScheduledChunk

        greedy = SamplingParams(temperature=0.0)
        tokens = sum(len(p) for p in prompts)
        times = []
        for rep in range(reps + 1):
            ids = [f"p{rep}-{i}" for i in range(len(prompts))]
            new = [NewSequence(r, p, [], greedy) for r, p in zip(ids, prompts, strict=True)]
            chunks = [ScheduledChunk(r, p, 0, list(range(i * self.per_seq,
                                                         (i + 1) * self.per_seq)), True)
                      for i, (r, p) in enumerate(zip(ids, prompts, strict=True))]
            t0 = time.perf_counter()
            self._step(new, chunks, [])
            times.append(time.perf_counter() - t0)
            self._step([], [], ids)
        return tokens / statistics.median(times[1:])  # the first run is warm-up


class _HFModel:
    """transformers' own forward on the same weights (same dtype and device)."""

    def __init__(self, runner: Any) -> None:
        import torch

        from aioengine.bench.hf_load import hf_model
        from aioengine.hub import resolve_model

        resolved = resolve_model(runner.config.model, runner.config.tokenizer)
        self.model = hf_model(resolved, runner.dtype).to(runner.device).eval()
        self.device = runner.device
        self.torch = torch

    def weight_bytes(self) -> int:
        m = self.model
        emb = m.get_input_embeddings().weight
        return _weight_bytes(m, emb, emb is m.get_output_embeddings().weight)

    def decode_ms(self, prompts: list[list[int]], warmup: int, steps: int) -> float:
        torch = self.torch
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor(prompts, device=self.device), use_cache=True,
                             logits_to_keep=1)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            times = []
            for _ in range(warmup + steps):
                t0 = time.perf_counter()
                out = self.model(input_ids=nxt, past_key_values=cache, use_cache=True)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                nxt.tolist()  # to the host, as our sampler does
                times.append(time.perf_counter() - t0)
                cache = out.past_key_values
        return statistics.median(times[warmup:]) * 1000

    def prefill_tokens_per_s(self, prompts: list[list[int]], reps: int) -> float:
        torch = self.torch
        ids = torch.tensor(prompts, device=self.device)
        times = []
        with torch.inference_mode():
            for _ in range(reps + 1):
                t0 = time.perf_counter()
                out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
                out.logits[:, -1].argmax(-1).tolist()
                times.append(time.perf_counter() - t0)
        return ids.numel() / statistics.median(times[1:])


def _child(arg: str) -> None:
    spec = json.loads(arg)
    sizes = Sizes(**{k: tuple(v) if isinstance(v, list) else v
                     for k, v in spec["sizes"].items()})
    rows = _measure(spec["model"], spec["names"], sizes)
    print(MARK + json.dumps(rows), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1])
