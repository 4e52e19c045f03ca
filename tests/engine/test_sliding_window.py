"""Sliding-window attention in the engine: a Mistral model (window 8, blocks of 4) frees the
KV blocks that fall wholly out of every sequence's window while it generates far past the
window, and its greedy tokens still equal transformers'."""

from __future__ import annotations

import time

import pytest
import torch

from aioengine.config import EngineConfig
from aioengine.engine.core import EngineCore
from aioengine.hub.tiny import ensure_tiny
from aioengine.messages import AddRequest, SamplingParams
from tests.worker.hf_models import make_hf_model

WINDOW = 8
PROMPTS = {"a": 30, "b": 19, "c": 6}
NEW = 40


@pytest.mark.parametrize(("executor", "tp"), [("uniproc", 1), ("mp", 2)])
def test_blocks_out_of_the_window_are_freed_and_tokens_match_transformers(tmp_path, one_thread,
                                                                           executor, tp):
    """In process, and over worker processes at TP=2 (the window reaches the scheduler from
    the workers' ready message)."""
    path = str(tmp_path / "mistral")
    hf = make_hf_model("mistral", path, seed=9, sliding_window=WINDOW)
    gen = torch.Generator().manual_seed(2)
    prompts = {k: torch.randint(0, 256, (n,), generator=gen).tolist()
               for k, n in PROMPTS.items()}
    # 24 blocks of 4 hold 96 tokens: the three sequences reach 70 + 59 + 46 tokens, so without
    # freeing they would not fit together (preemption); each needs ~3-4 live blocks with it.
    config = EngineConfig(model=path, tokenizer=ensure_tiny(), device="cpu", block_size=4,
                          num_kv_blocks=24, max_model_len=96, max_num_seqs=4,
                          max_num_batched_tokens=16,  # the 30-token prompt goes in chunks
                          executor=executor, tensor_parallel_size=tp)
    core = EngineCore(config)
    try:
        assert core.scheduler.kv_window == WINDOW
        for rid, prompt in prompts.items():
            core.add_request(AddRequest(rid, prompt, SamplingParams(
                max_tokens=NEW, temperature=0.0, ignore_eos=True), time.time()))
        out: dict[str, list[int]] = {k: [] for k in prompts}
        peak, freed_seen = 0, 0
        while core.has_work():
            for d in core.step():
                out[d.request_id].extend(d.new_token_ids)
            peak = max(peak, core.block_manager.num_used_blocks)
            freed_seen = max([freed_seen] + [r.num_window_freed
                                             for r in core.scheduler.running])
        stats = core.get_stats()
        assert stats.num_preempted_total == 0
        assert freed_seen >= 10  # a sequence ran with 10+ of its leading blocks given back
        assert peak <= 12, peak  # 8 measured; 24 (all) and 2 preemptions without freeing
        assert stats.kv_blocks_used == 0
    finally:
        core.shutdown()
    for rid, prompt in prompts.items():
        ids = torch.tensor([prompt])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out[rid] == ref[0, len(prompt):].tolist(), rid
