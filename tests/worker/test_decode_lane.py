"""The decode lane (a decode step from token ids to logits in the plan's one C call,
``DecodePlan.step_logits``) against the module path it replaces (the attention metadata, the
embedding and rotary modules, the plan's layers, ``compute_logits`` and the sampler): the same
compiled functions in the same order, so bit-equal logits and the same tokens."""

from __future__ import annotations

import shutil

import pytest
import torch

from aioengine.config import EngineConfig
from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import NewSequence, ScheduledChunk, StepInput
from aioengine.worker.cpu.decode_plan import DecodePlan
from aioengine.worker.model_runner import ModelRunner
from aioengine.worker.ops.plan import PlanError
from tests.worker.hf_models import make_hf_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

BLOCK = 4


def _runner(path: str, quantization: str, threads: int, kv: str = "auto") -> ModelRunner:
    r = ModelRunner(EngineConfig(model=path, device="cpu", dtype="float32", block_size=BLOCK,
                                 num_kv_blocks=64, max_num_seqs=4, num_threads=threads,
                                 quantization=quantization, kv_cache_dtype=kv))
    r.allocate_kv_cache(64)
    return r


def _decode(r: ModelRunner, tag: str, temperature: float, steps: int = 5,
            seqs: int = 3) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prompts of 3..9 tokens, then ``steps`` decode steps of every sequence together and
    three of the first alone; the tokens per step and the logits the sampler saw."""
    seen: list[torch.Tensor] = []
    sample = r.sampler.sample

    def spy(logits, states, bitmask=None):
        seen.append(logits.clone())
        return sample(logits, states, bitmask)

    r.sampler.sample = spy  # type: ignore[method-assign]
    try:
        params = SamplingParams(temperature=temperature, max_tokens=64, seed=3)
        ids = [f"{tag}{i}" for i in range(seqs)]
        prompts = [[(7 * i + 3 * j) % 90 + 1 for j in range(3 + 3 * i)] for i in range(seqs)]
        tables = [list(range(16 * i, 16 * i + 16)) for i in range(seqs)]
        res = r.execute(StepInput(1, [NewSequence(q, p, [], params)
                                      for q, p in zip(ids, prompts, strict=True)],
                                  [ScheduledChunk(q, p, 0, t, True)
                                   for q, p, t in zip(ids, prompts, tables, strict=True)], []))
        last = [s.token_id for s in res.sampled]
        pos = [len(p) for p in prompts]
        out = [last]
        for k in range(steps):
            res = r.execute(StepInput(2 + k, [], [
                ScheduledChunk(q, [tok], at, t, True)
                for q, tok, at, t in zip(ids, last, pos, tables, strict=True)], []))
            last = [s.token_id for s in res.sampled]
            pos = [p + 1 for p in pos]
            out.append(last)
        for k in range(3):  # the first sequence alone (T=1)
            res = r.execute(StepInput(10 + k, [], [ScheduledChunk(ids[0], [last[0]], pos[0],
                                                                  tables[0], True)], []))
            last[0] = res.sampled[0].token_id
            pos[0] += 1
            out.append([last[0]])
        r.execute(StepInput(20, [], [], ids))
        return out, seen
    finally:
        r.sampler.sample = sample  # type: ignore[method-assign]


def _plan(r: ModelRunner) -> DecodePlan:
    plan = r.model.cpu_path._plan
    assert isinstance(plan, DecodePlan), plan
    return plan


@pytest.mark.parametrize("variant", ["llama3-tied", "llama"])
@pytest.mark.parametrize("quantization", ["none", "q8_0", "q4_1"])
@pytest.mark.parametrize("threads", [1, 2])
def test_lane_equals_the_module_path(tmp_path, monkeypatch, variant, quantization, threads):
    """Greedy (the argmax in the lane's call) and sampled (the lane's logits to the sampler),
    a tied head (quantized: the embedding rows looked up in its x8 blocks) and an untied one,
    float and quantized weights, one and two threads, float32 and float16 KV caches."""
    make_hf_model(variant, str(tmp_path), seed=11)
    for kv in ("auto", "float16"):
        r = _runner(str(tmp_path), quantization, threads, kv)
        for temperature in (0.0, 0.8):
            monkeypatch.setattr(r.model.cpu_path, "lane", False)
            slow, slow_logits = _decode(r, "s", temperature)
            assert _plan(r).lane_runs == 0
            monkeypatch.setattr(r.model.cpu_path, "lane", True)
            fast, fast_logits = _decode(r, "f", temperature)
            assert _plan(r).lane_runs == 8, (kv, temperature)
            assert fast == slow, (kv, temperature)
            if temperature:  # every step's logits reached the sampler: bit-equal
                assert len(fast_logits) == len(slow_logits) == 9
                for a, b in zip(fast_logits, slow_logits, strict=True):
                    assert torch.equal(a, b)
            else:  # the prefill's only: the lane's argmax chose the decodes' tokens
                assert len(fast_logits) == 1 and len(slow_logits) == 9
            _plan(r).lane_runs = 0


def test_argmax_takes_the_first_largest_and_nan_as_numpy(tmp_path, monkeypatch):
    """Every logit equal (a zero head): token 0, the first of the ties; a NaN logit: its
    index, as numpy's argmax (the module path's) gives."""
    make_hf_model("llama", str(tmp_path), seed=5)
    r = _runner(str(tmp_path), "none", 2)
    head = r.model.lm_head.weight
    head.data.zero_()
    for lane in ("0", "1"):
        monkeypatch.setattr(r.model.cpu_path, "lane", lane == "1")
        tokens, _ = _decode(r, "z" + lane, 0.0, steps=2)
        assert all(t == 0 for step in tokens for t in step), tokens
    head.data[37] = float("nan")
    head.data[90] = float("nan")
    for lane in ("0", "1"):
        monkeypatch.setattr(r.model.cpu_path, "lane", lane == "1")
        tokens, _ = _decode(r, "n" + lane, 0.0, steps=2)
        assert all(t == 37 for step in tokens for t in step), tokens
    assert _plan(r).lane_runs == 10  # two runs of 2 + 3 decode steps


def test_no_lane_where_the_model_needs_more(tmp_path, monkeypatch):
    """Sliding-window layers (mistral): the plan runs its layers, the module path the rest;
    the same tokens either way."""
    make_hf_model("mistral", str(tmp_path), seed=3)
    r = _runner(str(tmp_path), "q8_0", 2)
    fast, _ = _decode(r, "a", 0.0)
    plan = _plan(r)
    assert plan.lane_runs == 0 and plan.runs > 0
    assert "sliding-window" in (plan.lane_reason or "")
    monkeypatch.setattr(r.model.cpu_path, "lane", False)
    slow, _ = _decode(r, "b", 0.0)
    assert fast == slow


def test_a_position_past_the_rotary_table_is_refused_by_name(tmp_path):
    """The module path would fail in an index_select; the lane names the part and writes
    nothing to the KV cache."""
    make_hf_model("llama3-tied", str(tmp_path), seed=5)
    r = _runner(str(tmp_path), "q8_0", 1)
    _decode(r, "w", 0.0, steps=1)  # the plan and its lane are built
    table = r.model.rotary.cos_cache.shape[0]
    before = [c.clone() for c in r.kv_caches]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    r.execute(StepInput(30, [NewSequence("far", [5], [], params)], [], []))
    with pytest.raises(PlanError, match="rotary rows: a token id or position outside the "
                                        "table"):
        r.execute(StepInput(31, [], [ScheduledChunk("far", [5], table, [0] * (table // BLOCK
                                                                             + 1), True)], []))
    assert all(torch.equal(a, b) for a, b in zip(before, r.kv_caches, strict=True))


def test_a_float_table_moved_after_the_plan_is_followed(tmp_path, monkeypatch):
    """Quantized layers, an untied float32 embedding table whose storage is replaced (as
    ``gemv.huge_page_weights`` replaces a parameter's): the plan sees the new pointer and the
    lane reads the new table (review of the lane: it kept the freed one)."""
    make_hf_model("llama", str(tmp_path), seed=11)
    r = _runner(str(tmp_path), "q8_0", 1)
    _decode(r, "x", 0.0, steps=2)
    table = r.model.embed_tokens.weight
    table.data = (table.data * -3.0).contiguous()
    monkeypatch.setattr(r.model.cpu_path, "lane", False)
    slow, _ = _decode(r, "s", 0.0, steps=2)
    monkeypatch.setattr(r.model.cpu_path, "lane", True)
    fast, _ = _decode(r, "f", 0.0, steps=2)
    assert fast == slow
    assert _plan(r).lane_runs == 5


def test_a_chunk_without_tokens_is_refused_as_before(tmp_path, monkeypatch):
    """Two sampled chunks of two and zero tokens (as many tokens as sampled rows): the module
    path's error, nothing written to the KV cache."""
    make_hf_model("llama", str(tmp_path), seed=11)
    r = _runner(str(tmp_path), "none", 1)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    r.execute(StepInput(1, [NewSequence("a", [1, 2, 3], [], params),
                            NewSequence("b", [4, 5, 6], [], params)],
                        [ScheduledChunk("a", [1, 2, 3], 0, [0, 1], True),
                         ScheduledChunk("b", [4, 5, 6], 0, [2, 3], True)], []))
    before = [c.clone() for c in r.kv_caches]
    for start in (3, -1):
        with pytest.raises(ValueError, match=r"num_tokens >= 1|start_pos must be >= 0"):
            r.execute(StepInput(2, [], [ScheduledChunk("a", [7, 8], 3, [0, 1], True),
                                        ScheduledChunk("b", [] if start > 0 else [9], start,
                                                       [2, 3], True)], []))
    assert all(torch.equal(a, b) for a, b in zip(before, r.kv_caches, strict=True))


def test_no_lane_over_caches_that_do_not_fit(tmp_path):
    """KV caches of one kv head for a model of two (allocated for tp_size=2): no lane over
    them (the module path says what is wrong), nothing written past them."""
    make_hf_model("llama", str(tmp_path), seed=11)
    r = _runner(str(tmp_path), "none", 1)
    _, _, blocks, bs, d = r.kv_caches[0].shape
    n = 2 * blocks * bs * d
    buffers = [torch.zeros(2 * n) for _ in r.kv_caches]
    caches = [b[:n].view(2, 1, blocks, bs, d) for b in buffers]
    assert r.model.decode_logits([5], [(3, 1, [0, 1])], BLOCK, r.decode_kernel, caches,
                                 True) is None
    assert "KV cache of shape" in (r.model.cpu_path._plan[0] if isinstance(
        r.model.cpu_path._plan, tuple) else r.model.cpu_path._plan.lane_reason)
    assert all(int((b[n:] != 0).sum()) == 0 for b in buffers)
    with pytest.raises(ValueError, match="does not fit this rank's 2 kv heads"):
        r.model(torch.tensor([5]), torch.tensor([3]), None, caches)


def test_one_scratch_for_every_batch_size(tmp_path):
    """Batch sizes 1..5 in turn: one set of scratch rows, sized for the most rows seen."""
    make_hf_model("llama3-tied", str(tmp_path), seed=7)
    r = _runner(str(tmp_path), "q8_0", 1)
    for seqs in (1, 3, 2, 4, 1):
        _decode(r, f"b{seqs}", 0.0, steps=1, seqs=seqs)
    plan = _plan(r)
    assert plan.lane_runs == 5 * 4 and plan._lane_rows == 4 and len(plan._lane_steps) == 1
