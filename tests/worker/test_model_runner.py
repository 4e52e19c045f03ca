"""ModelRunner on the built-in tiny model against Hugging Face transformers on the same weights:
greedy over several steps with mixed prefill/decode batches, chunked prefill, preemption by
recompute, logprobs, and the errors a bad StepInput gets."""

from __future__ import annotations

import pytest
import torch

from aioengine.config import EngineConfig
from aioengine.hub import resolve_model
from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import NewSequence, ScheduledChunk, StepInput
from aioengine.worker.attention import build_attention_metadata
from aioengine.worker.model_runner import ModelRunner, StepInputError
from tests.worker.step_driver import StepDriver

BLOCK = 4
BLOCKS = 96
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    r = ModelRunner(EngineConfig(model="tiny", device="cpu", dtype="float32", block_size=BLOCK,
                                 num_kv_blocks=BLOCKS))
    r.allocate_kv_cache(r.plan_kv_blocks())
    return r


@pytest.fixture(autouse=True)
def _fresh_state(runner: ModelRunner) -> None:
    runner.states.clear()


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny").model_path,
                                                 dtype=torch.float32)
    return model.eval()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding with transformers' own forward and KV cache."""
    out_ids: list[int] = []
    ids, cache = torch.tensor([prompt]), None
    with torch.inference_mode():
        for _ in range(n):
            out = model(ids, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            out_ids.append(int(out.logits[0, -1].argmax()))
            ids = torch.tensor([[out_ids[-1]]])
    return out_ids


def prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 1500, (n,), generator=g).tolist()


def run(runner: ModelRunner, driver: StepDriver, budget: dict[str, int] | None = None) -> None:
    step = driver.step(budget)
    result = runner.execute(step)
    assert result.step_id == step.step_id
    assert [s.request_id for s in result.sampled] == \
        [c.request_id for c in step.chunks if c.sample]
    driver.apply(result)


def test_greedy_matches_hf_with_mixed_prefill_decode_batches(runner, hf_model) -> None:
    d = StepDriver(BLOCK, BLOCKS)
    prompts = {"a": prompt(1, 9), "b": prompt(2, 21), "c": prompt(3, 5)}
    d.add("a", prompts["a"], GREEDY)
    d.add("b", prompts["b"], GREEDY)
    run(runner, d, {"a": 100, "b": 7})  # a: whole prompt; b: first chunk, no sample
    run(runner, d, {"a": 1, "b": 7})  # a: decode; b: middle chunk
    d.add("c", prompts["c"], GREEDY)
    d.add("s", prompt(4, 6), SamplingParams(temperature=1.0, seed=7, max_tokens=64))
    run(runner, d)  # a decode, b last chunk (samples), c and s whole prompts
    for _ in range(7):
        run(runner, d)
    for rid in ("a", "b", "c"):
        got = d.seqs[rid].outputs
        assert len(got) >= 8
        assert got == hf_greedy(hf_model, prompts[rid], len(got)), rid


def test_greedy_matches_hf_with_decodes_attended_in_place(runner, hf_model) -> None:
    """Two sequences on runs of adjacent blocks (their decodes attend to spans of the cache,
    no gather) beside one on blocks in reverse order (gathered), in the same steps."""
    d = StepDriver(BLOCK, BLOCKS)
    prompts = {"a": prompt(5, 70), "b": prompt(6, 66), "c": prompt(7, 68)}
    tables = {"a": list(range(0, 20)), "b": list(range(20, 40)), "c": list(range(59, 39, -1))}
    for rid, p in prompts.items():
        d.add(rid, p, GREEDY)
        d.seqs[rid].blocks = list(tables[rid])
    run(runner, d)  # prefills
    for _ in range(8):
        step = d.step()
        meta = build_attention_metadata([(c.start_pos, 1, c.block_table) for c in step.chunks],
                                        BLOCK)
        assert len(meta.decode.spans) == 2 and len(meta.decode.buckets) == 1
        d.apply(runner.execute(step))
    for rid in prompts:
        got = d.seqs[rid].outputs
        assert len(got) == 9
        assert got == hf_greedy(hf_model, prompts[rid], len(got)), rid


def test_preemption_by_recompute_continues_identically(runner, hf_model) -> None:
    seeded = SamplingParams(temperature=0.9, seed=11, max_tokens=64)
    p = prompt(5, 7)
    ref = StepDriver(BLOCK, BLOCKS)
    ref.add("g", p, GREEDY)
    ref.add("s", p, seeded)
    for _ in range(10):
        run(runner, ref)
    want = {rid: ref.finish(rid).outputs for rid in ("g", "s")}
    runner.execute(ref.step({}))

    d = StepDriver(BLOCK, BLOCKS)
    d.add("g", p, GREEDY)
    d.add("s", p, seeded)
    for _ in range(4):
        run(runner, d)
    d.preempt("g")
    d.preempt("s")
    run(runner, d, {"g": 5, "s": 100})  # g recomputes in chunks; s in one go
    for _ in range(7):
        run(runner, d)
    assert d.seqs["s"].outputs[:10] == want["s"]
    assert d.seqs["g"].outputs[:10] == want["g"] == hf_greedy(hf_model, p, 10)


def test_logprobs_match_hf_log_softmax(runner, hf_model) -> None:
    p = prompt(6, 8)
    d = StepDriver(BLOCK, BLOCKS)
    d.add("l", p, SamplingParams(temperature=0.0, logprobs=3))
    step = d.step()
    result = runner.execute(step)
    with torch.inference_mode():
        ref = torch.log_softmax(hf_model(torch.tensor([p])).logits[0, -1].float(), dim=-1)
    lp = result.sampled[0].logprob
    assert lp is not None and lp.token_id == int(ref.argmax())
    assert lp.logprob == pytest.approx(ref.max().item(), abs=1e-4)
    top = ref.topk(3)
    assert [t for t, _ in lp.top] == top.indices.tolist()
    assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_finished_ids_drop_state_and_empty_steps_run(runner) -> None:
    d = StepDriver(BLOCK, BLOCKS)
    d.add("x", prompt(7, 5), GREEDY)
    run(runner, d)
    assert "x" in runner.states and runner.states["x"].output_token_ids == d.seqs["x"].outputs
    d.finish("x")
    result = runner.execute(d.step())
    assert result.sampled == [] and "x" not in runner.states


def step_with(chunks: list[ScheduledChunk], new: list[NewSequence] | None = None) -> StepInput:
    return StepInput(99, new or [], chunks, [])


def test_bad_step_inputs_raise_specific_errors(runner) -> None:
    for sample in (True, False):
        with pytest.raises(StepInputError, match="unknown request 'ghost'"):
            runner.execute(step_with([ScheduledChunk("ghost", [5], 0, [0], sample)]))
    seq = NewSequence("dup", [5, 6], [], GREEDY)
    runner.execute(step_with([], [seq]))
    with pytest.raises(StepInputError, match="'dup' is already registered"):
        runner.execute(step_with([], [seq]))
    with pytest.raises(StepInputError, match=f"block id {BLOCKS} is outside the KV cache"):
        runner.execute(step_with([ScheduledChunk("dup", [5, 6], 0, [BLOCKS], True)]))
    vocab = runner.spec.vocab_size
    with pytest.raises(StepInputError, match=f"token id {vocab} is outside the vocabulary"):
        runner.execute(step_with([ScheduledChunk("dup", [5, vocab], 0, [0], True)]))
    with pytest.raises(ValueError, match="block table has 1 blocks"):
        runner.execute(step_with([ScheduledChunk("dup", [5] * 6, 0, [0], True)]))


def test_profile_forward_runs_the_largest_step(runner) -> None:
    """The GPU planner's profiling step (max_num_batched_tokens prompt tokens, logits for up to
    max_num_seqs rows, a top-p sample) runs here on CPU too, on a scratch cache."""
    caches = runner.kv_caches
    runner._profile_forward()
    assert runner.kv_caches is caches and runner.states == {}
