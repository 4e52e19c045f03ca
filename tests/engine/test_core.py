"""EngineCore in process with the uniproc executor on the tiny model."""

import re
import time

import pytest

from aioengine.engine.core import EngineCore
from aioengine.messages import AddRequest, SamplingParams

from .conftest import small_config
from .workload import Output, assert_same_greedy, run_core, workload


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def add(core, rid, prompt, params, **kw) -> AddRequest:
    req = AddRequest(rid, prompt, params, time.time(), **kw)
    core.add_request(req)
    return req


def drain(core) -> dict[str, Output]:
    outs: dict[str, Output] = {}
    while core.has_work():
        for d in core.step():
            outs.setdefault(d.request_id, Output()).add(d)
    return outs


def test_ready_payload(core, vocab_size):
    payload = dict(core.ready_payload)
    # 4 layers x 4 tokens x 4 kv heads x 32, k and v: float16 with the decode kernel, else 32
    dtype_bytes = {"float16": 2, "float32": 4}[payload.pop("kv_dtype")]
    assert payload.pop("kv_bytes_per_block") == 2 * 4 * 4 * 4 * 32 * dtype_bytes
    assert payload == {"num_kv_blocks": 40, "max_model_len": 96, "block_size": 4,
                       "eos_token_id": core.model_info.eos_token_ids[0],
                       "vocab_size": vocab_size, "kv_sized_by": "num_kv_blocks=40",
                       "task": "generate"}


def test_300_requests_under_preemption_match_each_run_alone(core, vocab_size,
                                                            alone_reference):
    preempted = core.get_stats().num_preempted_total
    got = run_core(core, workload(vocab_size))
    stats = core.get_stats()
    assert stats.num_preempted_total > preempted  # the small cache really forced preemption
    assert stats.kv_blocks_used == 0 and stats.num_running == stats.num_waiting == 0
    assert stats.prefix_cache_hit_rate > 0
    assert_same_greedy(got, alone_reference)
    assert any(o.num_cached_tokens for o in got.values())


@pytest.mark.parametrize(("prompt", "match"), [
    ([], "the prompt is empty"),
    ([5] * 97, "97 tokens, more than max_model_len=96"),
    ([5, 10**6], r"prompt token id 1000000 is outside the vocabulary \[0, "),
    ([5, -1], "prompt token id -1 is outside the vocabulary"),
])
def test_bad_prompts_get_an_error_output_and_the_engine_goes_on(core, prompt, match):
    add(core, "bad", prompt, greedy(3))
    add(core, "good", [5, 6, 7], greedy(3))
    outs = drain(core)
    assert outs["bad"].finish_reason == "error" and outs["bad"].tokens == []
    assert re.search(match, outs["bad"].error), outs["bad"].error
    assert outs["good"].finish_reason in ("length", "stop") and outs["good"].tokens


@pytest.mark.parametrize("eos", [-1, 10**6])
def test_eos_token_id_outside_the_vocabulary_is_an_error(core, eos):
    add(core, "bad-eos", [5, 6, 7], greedy(3), eos_token_id=eos)
    out = drain(core)["bad-eos"]
    assert out.finish_reason == "error" and out.tokens == []
    assert re.search(rf"eos_token_id {eos} is outside the vocabulary \[0, ", out.error)


def test_duplicate_request_id_is_an_error_for_the_newcomer_only(core):
    add(core, "dup", [5, 6, 7], greedy(4, ignore_eos=True))
    add(core, "dup", [8, 9], greedy(4))
    first = core.step()
    assert next((d.finish_reason, d.error) for d in first if d.request_id == "dup"
            and d.finish_reason) == ("error", "request id 'dup' is already in the engine")
    rest = drain(core)
    assert rest["dup"].finish_reason == "length"


def test_prompt_of_exactly_max_model_len_generates_one_token(core):
    add(core, "full", [7] * 96, greedy(10))
    out = drain(core)["full"]
    assert out.tokens and len(out.tokens) == 1 and out.finish_reason == "length"


def test_abort_frees_blocks_at_once_is_idempotent_and_reported(core):
    add(core, "a", [5] * 30, greedy(50, ignore_eos=True))
    add(core, "b", [6] * 30, greedy(50, ignore_eos=True))
    add(core, "c", [7] * 30, greedy(50, ignore_eos=True), priority=1)
    for _ in range(3):
        core.step()
    assert core.get_stats().kv_blocks_used > 0
    core.abort(["a", "b", "c", "unknown"])
    assert core.get_stats().kv_blocks_used == 0
    core.abort(["a", "b"])
    deltas = core.step()
    assert sorted((d.request_id, d.finish_reason) for d in deltas) == [
        ("a", "abort"), ("b", "abort"), ("c", "abort")]
    assert not core.has_work()


def test_prefix_cache_hit_gives_the_same_tokens_and_reset_forgets(core):
    core.reset_prefix_cache()
    prompt = list(range(100, 140))
    add(core, "p1", prompt, greedy(6, ignore_eos=True))
    first = drain(core)["p1"]
    add(core, "p2", prompt, greedy(6, ignore_eos=True))
    second = drain(core)["p2"]
    assert second.num_cached_tokens == 36  # 9 full blocks of 4; the last token is recomputed
    assert second.tokens == first.tokens
    core.reset_prefix_cache()
    add(core, "p3", prompt, greedy(6, ignore_eos=True))
    third = drain(core)["p3"]
    assert third.num_cached_tokens == 0 and third.tokens == first.tokens


def test_stats_count_tokens_and_finishes(core):
    before = core.get_stats()
    add(core, "s", [5, 6, 7, 8], greedy(5, ignore_eos=True))
    drain(core)
    after = core.get_stats()
    assert after.prompt_tokens_total - before.prompt_tokens_total == 4
    assert after.generation_tokens_total - before.generation_tokens_total == 5
    assert after.num_requests_finished_total - before.num_requests_finished_total == 1
    assert after.kv_blocks_total == 40


def test_eos_stops_unless_ignored(core):
    add(core, "probe", [5, 6, 7], greedy(3, ignore_eos=True))
    probe = drain(core)["probe"].tokens
    eos = probe[1]  # pretend the second token is this request's eos
    add(core, "e", [5, 6, 7], greedy(3), eos_token_id=eos)
    add(core, "i", [5, 6, 7], greedy(3, ignore_eos=True), eos_token_id=eos)
    outs = drain(core)
    assert outs["e"].tokens == probe[:2] and outs["e"].finish_reason == "stop"
    assert outs["i"].tokens == probe and outs["i"].finish_reason == "length"


def test_min_tokens_masks_the_requests_own_eos(core):
    add(core, "probe", [5, 6, 7], greedy(4, ignore_eos=True))
    probe = drain(core)["probe"].tokens
    eos = probe[0]  # the request's eos is the very token greedy would pick first
    add(core, "m", [5, 6, 7], greedy(4, min_tokens=2), eos_token_id=eos)
    out = drain(core)["m"]
    assert out.tokens[0] != eos and eos not in out.tokens[:2]


def test_max_model_len_beyond_kv_capacity_is_refused(one_thread):
    with pytest.raises(ValueError, match=r"max_model_len 96 does not fit the KV cache: 10 "
                                         r"blocks x 4 tokens = 40 tokens"):
        EngineCore(small_config(num_kv_blocks=10))


def test_engine_detokenizes_when_asked(one_thread):
    core = EngineCore(small_config(detokenize_in="engine"))
    try:
        add(core, "t", [5, 6, 7, 8], greedy(6, ignore_eos=True))
        out = drain(core)["t"]
    finally:
        core.shutdown()
    from aioengine.hub import resolve_model
    from aioengine.text.detokenize import load_hf_tokenizer

    tok = load_hf_tokenizer(resolve_model("tiny").tokenizer_path)
    assert out.text and out.text == tok.decode([5, 6, 7, 8, *out.tokens])[
        len(tok.decode([5, 6, 7, 8])):]
