"""ModelRunner: the model, its paged KV cache and the per-request sampling state of one rank.

``execute(StepInput) -> StepResult`` is the decode hot path: it registers new sequences, drops
finished ones, turns the step's chunks into one flat varlen batch, runs the forward, computes
logits only for the chunks that sample, and samples. Every rank runs the forward (tensor
parallel layers meet in collectives); only the driver (rank 0) samples and reports tokens.

Use::

    runner = ModelRunner(config, rank=0, world_size=1)
    runner.allocate_kv_cache(runner.plan_kv_blocks())   # or a block count from the engine
    result = runner.execute(step_input)
"""

from __future__ import annotations

import logging
import os

import torch

from aioengine.config import EngineConfig
from aioengine.hub import read_model_info, resolve_model
from aioengine.hub.pooling import read_pooling_config
from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import (
    PREVIOUS_TOKEN,
    PooledOutput,
    SampledToken,
    ScheduledChunk,
    StepInput,
    StepResult,
)
from aioengine.units import format_bytes
from aioengine.worker import gemv
from aioengine.worker.attention import build_attention_metadata
from aioengine.worker.attention.cpu_kernel import select_decode_kernel
from aioengine.worker.capacity import KvPlan, MemoryProfile, max_context_len, plan_kv_cache
from aioengine.worker.cpu.backend import CpuBackend
from aioengine.worker.encoder.runner import pool_states
from aioengine.worker.kv_cache import allocate_kv_cache, kv_cache_bytes_per_block, kv_cache_dtype
from aioengine.worker.loader import load_model
from aioengine.worker.memory import HeapTrimmer
from aioengine.worker.sampler import Sampler, SamplerOutput, argmax_only
from aioengine.worker.sampler_state import SequenceState
from aioengine.worker.threads import (
    apply_thread_policy,
    cached_fastest_count,
    set_kernel_threads,
    usable_cpus,
)

logger = logging.getLogger(__name__)


class StepInputError(ValueError):
    """A ``StepInput`` that does not fit this worker's state (an engine-side bug): unknown or
    duplicate request ids, block ids past the cache, token ids past the vocabulary."""


class ModelRunner:
    def __init__(self, config: EngineConfig, *, rank: int = 0, world_size: int = 1,
                 device: str | None = None) -> None:
        """Load the model for ``rank`` of ``world_size`` (torch.distributed must already be
        initialised when ``world_size > 1``) on ``device`` (default ``config.device``; a worker
        passes ``cuda:N`` for its GPU). The KV cache comes later: ``allocate_kv_cache``."""
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.threads = apply_thread_policy(config, world_size)
        resolved = resolve_model(config.model, config.tokenizer)
        self.model, self.hf_config = load_model(
            resolved, dtype=config.dtype, device=device or config.device,
            load_format=config.load_format, tp_rank=rank, tp_size=world_size, seed=config.seed,
            quantization=config.quantization, quant_activations=config.quant_activations,
            quant_x8=config.cpu_kernels.quant_x8,
            quant_x8_prefill=config.cpu_kernels.quant_x8_prefill)
        self.spec = self.model.spec
        # Sliding window of every layer (KV blocks before it can be freed), else None.
        self.kv_window = self.spec.sliding_window if self.spec.all_layers_windowed else None
        self.device = self.model.device
        self.dtype = self.model.dtype
        # how the model executes on CPU (decode path, GEMV, huge pages, code path), decided once;
        # the GEMV's pool uses the rank's thread budget (torch's pool is idle meanwhile)
        self.cpu_backend = CpuBackend(self.model, config.cpu_kernels, self.threads)
        self.uses_gemv_kernel = self.cpu_backend.uses_gemv
        set_kernel_threads(None)  # torch's count, unless measured below
        self.kernel_threads_measured = False  # True: measured at this load, not read back
        if config.num_threads is None and self.device.type == "cpu":
            self._pick_kernel_threads(resolved.model_path)
        self.decode_kernel = select_decode_kernel(config.cpu_decode_attention, self.device,
                                                  self.dtype)
        self.kv_dtype = kv_cache_dtype(config.kv_cache_dtype, self.dtype, self.device,
                                       self.decode_kernel is not None)
        self.max_model_len = max_context_len(config, self.spec)
        info = read_model_info(resolved.model_path)
        self.eos_token_ids = tuple(info.eos_token_ids)
        # a decoder embedder (sentence-transformers files beside a causal model): how its
        # pooling requests' hidden states become one vector
        self.pooling = read_pooling_config(resolved.model_path) if info.task == "embed" \
            else None
        self.sampler = Sampler(self.spec.vocab_size, seed=config.seed)
        self.states: dict[str, SequenceState] = {}
        self.kv_caches: list[torch.Tensor] = []
        self.num_kv_blocks = 0
        self.memory_profile: MemoryProfile | None = None
        self.kv_plan: KvPlan | None = None  # what plan_kv_blocks decided
        # CPU: hand a prefill's freed temporaries back to the system (see worker.memory)
        self.heap_trimmer = HeapTrimmer() if self.device.type == "cpu" else None

    def _pick_kernel_threads(self, model_path: str) -> None:
        """torch keeps one CPU free (its OpenMP pool spins when oversubscribed); the compiled
        kernels' pool (dynamic chunks, short spins, yields) may use every CPU of the rank: how
        many helps decode is measured here, once per machine and model (cached; docs/
        benchmarks.md): every quantized weight's batch-1 linear in a row (a decode step's
        reads), or the largest float32 matrix through the GEMV where none is quantized."""
        quantized = [q for m in self.model.modules()
                     for q in (getattr(m, "qweight", None), getattr(m, "qhead", None))
                     if q is not None]
        largest = self._largest_weight()
        if not quantized and not (self.uses_gemv_kernel and largest is not None):
            return
        budget = max(1, usable_cpus() // self.world_size)
        if quantized:
            xs: list[torch.Tensor] = []  # made when measured (not on a warm start)

            def run(n: int) -> None:
                xs[:] = xs or [torch.randn(1, q.in_features) for q in quantized]
                set_kernel_threads(n)
                for q, x in zip(quantized, xs, strict=True):
                    q.forward(x)

            kernel_path = quantized[0].kernel.path
            layout = repr(quantized[0].policy)
        else:
            def run(n: int) -> None:
                gemv.set_threads(n)
                gemv.linear(torch.ones(1, largest.shape[1]), largest)

            kernel_path, layout = gemv.kernel_path(), "float32"
        st = os.stat(model_path)
        # the layout names the quantization as loaded (quantization="auto" and "gguf" keep the
        # same blocks: one measurement)
        key = {"model": os.path.realpath(model_path), "size": st.st_size,
               "mtime_ns": st.st_mtime_ns, "layout": layout, "kernel": kernel_path,
               "rank": self.rank, "world_size": self.world_size}
        n, self.kernel_threads_measured = cached_fastest_count(key, budget, run)
        set_kernel_threads(n)
        gemv.set_threads(n)  # the same pool: a quantized model's float matrices too

    def _largest_weight(self) -> torch.Tensor | None:
        """The largest float matrix (None when every one is kept quantized)."""
        return max((p for p in self.model.parameters() if p.dim() == 2),
                   key=lambda p: p.numel(), default=None)

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    # ---- capacity ----------------------------------------------------------------------------
    def plan_kv_blocks(self) -> int:
        """Blocks this rank can hold under the config (see ``aioengine.worker.capacity``)."""
        plan = plan_kv_cache(self.config, self.spec, self.kv_dtype, self.device,
                             self.world_size, profile_forward=self._profile_forward)
        self.kv_plan, self.memory_profile = plan, plan.profile
        return plan.num_blocks

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes one KV block takes on this rank (all layers, k and v)."""
        return kv_cache_bytes_per_block(self.spec, self.config.block_size, self.kv_dtype,
                                        self.world_size)

    @property
    def kv_sized_by(self) -> str:
        """What decided the block count (for the log line and the engine's info)."""
        if self.kv_plan is None:
            if self.config.num_kv_blocks == self.num_kv_blocks:
                return f"num_kv_blocks={self.num_kv_blocks}"
            return "the caller (a block count given to allocate_kv_cache)"
        if self.kv_plan.num_blocks != self.num_kv_blocks:
            return f"the smallest over ranks (this rank's {self.kv_plan.sized_by})"
        return self.kv_plan.sized_by

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate and write (CPU: make resident; ``kv_cache_lock``: lock) the KV cache."""
        self.kv_caches = []  # free the old cache before allocating the new one
        self.kv_caches = allocate_kv_cache(self.spec, num_blocks, self.config.block_size,
                                           self.kv_dtype, self.device, self.world_size,
                                           lock=self.config.kv_cache_lock
                                           and self.device.type == "cpu")
        self.num_kv_blocks = num_blocks
        tokens = num_blocks * self.config.block_size
        per_seq = -(-self.max_model_len // self.config.block_size)
        logger.info("rank %d: KV cache of %d blocks = %d tokens (%.1f sequences of %d), %s in "
                    "%s on %s%s; sized by %s", self.rank, num_blocks, tokens,
                    num_blocks / per_seq, self.max_model_len,
                    format_bytes(num_blocks * self.kv_bytes_per_block),
                    str(self.kv_dtype).removeprefix("torch."), self.device,
                    ", locked" if self.config.kv_cache_lock and self.device.type == "cpu"
                    else "", self.kv_sized_by)

    def _profile_forward(self) -> None:
        """The largest step the engine may schedule: ``max_num_batched_tokens`` prompt tokens
        in sequences of at most ``max_model_len``, logits for up to ``max_num_seqs`` rows."""
        cfg = self.config
        total = cfg.max_num_batched_tokens
        lens = [min(self.max_model_len, total - s) for s in range(0, total, self.max_model_len)]
        blocks = [-(-n // cfg.block_size) for n in lens]
        caches = allocate_kv_cache(self.spec, sum(blocks), cfg.block_size, self.kv_dtype,
                                   self.device, self.world_size)
        chunks, first = [], 0
        for n, b in zip(lens, blocks, strict=True):
            chunks.append((0, n, list(range(first, first + b))))
            first += b
        with torch.inference_mode():
            meta = build_attention_metadata(chunks, cfg.block_size, self.device,
                                            sliding_window=self.spec.sliding_window,
                                            window_only=self.spec.all_layers_windowed)
            ids = torch.zeros(total, dtype=torch.long, device=self.device)
            hidden = self.model(ids, meta.positions, meta, caches)
            rows = min(cfg.max_num_seqs, total)
            logits = self.model.compute_logits(hidden[:rows])
            if self.is_driver:
                state = SequenceState.create("profile", SamplingParams(top_p=0.9), [0], [], ())
                self.sampler.sample(logits, [state] * rows)
        del caches, hidden, logits

    # ---- stepping ----------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, step: StepInput) -> StepResult:
        states = self.states
        for rid in step.finished_ids:
            states.pop(rid, None)
        for seq in step.new_sequences:
            if seq.request_id in states:
                raise StepInputError(f"step {step.step_id}: request {seq.request_id!r} is "
                                     "already registered (a re-entering request must be in "
                                     "finished_ids first)")
            states[seq.request_id] = SequenceState.create(
                seq.request_id, seq.params, seq.prompt_token_ids, seq.output_token_ids,
                self.eos_token_ids if seq.eos_token_ids is None else tuple(seq.eos_token_ids))
        chunks = step.chunks
        if not chunks:
            return StepResult(step.step_id, [])
        if not self.kv_caches:
            raise RuntimeError("execute() before allocate_kv_cache()")

        input_ids: list[int] = []
        layout: list[tuple[int, int, list[int]]] = []
        sample_rows: list[int] = []
        sample_states: list[SequenceState] = []
        max_block = 0
        for i, c in enumerate(chunks):
            state = states.get(c.request_id)
            if state is None:
                raise StepInputError(f"step {step.step_id}: chunk for unknown request "
                                     f"{c.request_id!r} (never sent as a new sequence, or "
                                     "already finished)")
            tokens = c.token_ids
            if len(tokens) == 1 and tokens[0] == PREVIOUS_TOKEN:
                tokens = [self._previous_token(step.step_id, state)]
            input_ids += tokens
            layout.append((c.start_pos, len(tokens), c.block_table))
            if c.block_table:
                max_block = max(max_block, max(c.block_table))
            if c.sample:
                sample_rows.append(i)
                sample_states.append(state)
        self._check_ids(step.step_id, input_ids, max_block)

        lane = None
        if len(input_ids) == len(sample_rows) == len(chunks) and self.decode_kernel is not None:
            # every chunk one token and sampled: the CPU decode lane, where it runs (greedy
            # rows' argmax in it too)
            lane = self.model.decode_logits(input_ids, layout, self.config.block_size,
                                            self.decode_kernel, self.kv_caches,
                                            argmax_only(sample_states, step.bitmask))
        pooled: list[PooledOutput] = []
        if lane is None:
            logits, hidden = self._forward(input_ids, layout, sample_rows)
            if self.pooling is not None and self.is_driver:
                pooled = self._pool(step.step_id, chunks, layout, hidden)
            if logits is None:
                return StepResult(step.step_id, [], pooled)
            tokens = None
        else:
            logits, tokens = lane
        if not self.is_driver:
            return StepResult(step.step_id, [])
        out = SamplerOutput(tokens, [None] * len(tokens)) if tokens is not None \
            else self.sampler.sample(logits, sample_states, step.bitmask)
        sampled = []
        for state, token, logprob in zip(sample_states, out.token_ids, out.logprobs,
                                         strict=True):
            state.output_token_ids.append(token)
            sampled.append(SampledToken(state.request_id, token, logprob))
        return StepResult(step.step_id, sampled, pooled)

    def _pool(self, step_id: int, chunks: list[ScheduledChunk],
              layout: list[tuple[int, int, list[int]]],
              hidden: torch.Tensor) -> list[PooledOutput]:
        """The pooled vector of every pooling chunk (a whole input: the scheduler never splits
        one) from the final-normed hidden states, as the model's sentence-transformers files
        say (a decoder embedder: the last token's state, normalized)."""
        assert self.pooling is not None
        out, offset = [], 0
        for c, (start, n, _) in zip(chunks, layout, strict=True):
            if c.pool:
                if start != 0:
                    raise StepInputError(f"step {step_id}: pooling chunk of {c.request_id!r} "
                                         f"starts at {start}, not at its input's start")
                vector = pool_states(hidden[offset:offset + n], self.pooling.mode)
                if self.pooling.normalize:
                    vector = torch.nn.functional.normalize(vector, dim=-1)
                out.append(PooledOutput(c.request_id, vector.float().tolist()))
            offset += n
        return out

    def _forward(self, input_ids: list[int], layout: list[tuple[int, int, list[int]]],
                 sample_rows: list[int]) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The module path: the step's attention metadata, the forward, the logits of the rows
        that sample (None when none does) and the final hidden states."""
        meta = build_attention_metadata(layout, self.config.block_size, self.device,
                                        decode_kernel=self.decode_kernel,
                                        sliding_window=self.spec.sliding_window,
                                        window_only=self.spec.all_layers_windowed)
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        hidden = self.model(ids, meta.positions, meta, self.kv_caches)
        if self.heap_trimmer is not None and len(input_ids) > len(layout):
            self.heap_trimmer.after_step(len(input_ids) - len(layout))
        if not sample_rows:
            return None, hidden
        last = meta.last_token_index
        rows = last if len(sample_rows) == len(layout) else last[sample_rows]
        return self.model.compute_logits(hidden.index_select(0, rows)), hidden

    def _previous_token(self, step_id: int, state: SequenceState) -> int:
        """The token a ``[PREVIOUS_TOKEN]`` chunk stands for: the last one sampled here."""
        if not self.is_driver:
            raise StepInputError(f"step {step_id}: request {state.request_id!r} has a "
                                 f"PREVIOUS_TOKEN chunk, but rank {self.rank} does not sample "
                                 "(schedule one step ahead only with one rank)")
        if not state.output_token_ids:
            raise StepInputError(f"step {step_id}: request {state.request_id!r} has a "
                                 "PREVIOUS_TOKEN chunk before any token was sampled for it")
        return state.output_token_ids[-1]

    def _check_ids(self, step_id: int, input_ids: list[int], max_block: int) -> None:
        """Out-of-range ids would be an index error deep in the forward on CPU and a device-side
        assert (a dead CUDA context) on GPU: reject them here, naming the culprit."""
        if max_block >= self.num_kv_blocks:
            raise StepInputError(f"step {step_id}: block id {max_block} is outside the KV cache "
                                 f"of {self.num_kv_blocks} blocks")
        vocab = self.spec.vocab_size
        if not input_ids:
            raise StepInputError(f"step {step_id}: a chunk has no tokens")
        low, high = min(input_ids), max(input_ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise StepInputError(f"step {step_id}: token id {bad} is outside the vocabulary "
                                 f"[0, {vocab})")

    def release(self) -> None:
        """Drop the KV cache, the model and every request's state."""
        self.states.clear()
        self.kv_caches = []
        self.num_kv_blocks = 0
        self.model = None  # idempotent; the runner is unusable afterwards
