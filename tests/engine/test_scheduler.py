"""The real scheduler driven by a synthetic worker (see sim_worker.py)."""

import random

import pytest

from aioengine.engine.block_manager import BlockManager
from aioengine.engine.request import RequestStatus
from aioengine.engine.scheduler import Scheduler

from .sim_worker import SimWorker, drive, make_request, pooled_value, reference

BS = 4


def setup(num_blocks=64, *, max_num_seqs=16, budget=64, max_model_len=256, chunked=True,
          prefix=True):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=prefix)
    sched = Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                      max_model_len=max_model_len, enable_chunked_prefill=chunked)
    return sched, SimWorker(num_blocks, BS)


class Loop:
    """Steps the scheduler and keeps every streamed token (``out``) and delta (``deltas``)."""

    def __init__(self, sched, worker):
        self.sched, self.worker = sched, worker
        self.out: dict[str, list[int]] = {}
        self.deltas = []

    def step(self):
        s = self.sched.schedule()
        deltas = self.sched.update(s, self.worker.execute(s))
        for d in deltas:
            self.out.setdefault(d.request_id, []).extend(d.new_token_ids)
        self.deltas += deltas
        return s, deltas

    def finish(self) -> dict[str, list[int]]:
        for _ in range(10_000):
            if not self.sched.has_unfinished:
                return self.out
            self.step()
        raise AssertionError("did not finish")


def step(sched, worker):
    s = sched.schedule()
    return s, sched.update(s, worker.execute(s))


def test_single_request_matches_reference_and_frees_blocks():
    sched, worker = setup()
    sched.add_request(make_request("a", [5, 6, 7], max_tokens=10))
    out = drive(sched, worker)
    assert out["a"] == reference([5, 6, 7], 10)
    assert sched.bm.num_used_blocks == 0
    assert sched.num_finished_total == 1


def test_prefix_hit_cuts_prefill_work():
    prompt = list(range(1, 33))  # 8 full blocks
    sched, worker = setup()
    sched.add_request(make_request("a", prompt, max_tokens=2))
    drive(sched, worker)
    before = worker.tokens_computed
    sched.add_request(make_request("b", [*prompt, 40], max_tokens=2))
    s, deltas = step(sched, worker)
    assert [len(c.token_ids) for c in s.chunks] == [1]  # 32 cached tokens skipped
    assert deltas[0].num_cached_tokens == 32
    out = drive(sched, worker)
    assert [deltas[0].new_token_ids[0], *out["b"]] == reference([*prompt, 40], 2)
    assert worker.tokens_computed - before == 2
    assert sched.bm.hit_rate == pytest.approx(32 / (32 + 33))


def test_chunked_prefill_interleaves_with_decodes():
    sched, worker = setup(budget=8)
    sched.add_request(make_request("short", [1, 2], max_tokens=20))
    step(sched, worker)  # short is decoding now
    sched.add_request(make_request("long", list(range(50, 90)), max_tokens=2))
    for _ in range(5):
        s, deltas = step(sched, worker)
        sizes = {c.request_id: len(c.token_ids) for c in s.chunks}
        assert sizes["short"] == 1  # the decode runs every step ...
        assert sizes["long"] == 7  # ... and the prefill takes the rest of the budget
        assert s.chunks[0].request_id == "short"
        assert [d.request_id for d in deltas] == ["short"]
    out = drive(sched, worker)
    assert out["long"] == reference(list(range(50, 90)), 2)


def test_budget_and_max_num_seqs_bound_each_step():
    sched, worker = setup(max_num_seqs=3, budget=10)
    for i in range(6):
        sched.add_request(make_request(f"r{i}", [i + 1] * 6, max_tokens=3))
    loop = Loop(sched, worker)
    s, _ = loop.step()
    assert sum(len(c.token_ids) for c in s.chunks) <= 10
    assert [c.request_id for c in s.chunks] == ["r0", "r1"]  # 6 + 4 (chunk) tokens
    s, _ = loop.step()
    assert len(sched.running) == 3
    assert sum(len(c.token_ids) for c in s.chunks) <= 10
    out = loop.finish()
    for i in range(6):
        assert out[f"r{i}"] == reference([i + 1] * 6, 3)


def test_no_chunking_waits_for_a_step_with_room():
    sched, worker = setup(budget=10, chunked=False)
    sched.add_request(make_request("a", [1] * 6, max_tokens=3))
    sched.add_request(make_request("b", [2] * 6, max_tokens=3))
    s, _ = step(sched, worker)
    assert [(c.request_id, len(c.token_ids)) for c in s.chunks] == [("a", 6)]
    s, _ = step(sched, worker)
    assert [(c.request_id, len(c.token_ids)) for c in s.chunks] == [("a", 1), ("b", 6)]


def test_priority_then_fcfs():
    sched, worker = setup(max_num_seqs=1)
    sched.add_request(make_request("low", [1], max_tokens=1, priority=5))
    sched.add_request(make_request("hi1", [2], max_tokens=1, priority=0))
    sched.add_request(make_request("hi2", [3], max_tokens=1, priority=0))
    order = []
    while sched.has_unfinished:
        s, _ = step(sched, worker)
        order += [seq.request_id for seq in s.new_sequences]
    assert order == ["hi1", "hi2", "low"]


def test_preemption_picks_lowest_priority_newest_and_keeps_outputs():
    # 6 blocks of 4: three requests of 5-token prompts need 2 blocks each, then grow.
    sched, worker = setup(num_blocks=6, budget=64)
    prompts = {"old": [1] * 5, "new": [2] * 5, "vip": [3] * 5}
    sched.add_request(make_request("old", prompts["old"], max_tokens=12, priority=1))
    sched.add_request(make_request("new", prompts["new"], max_tokens=12, priority=1))
    sched.add_request(make_request("vip", prompts["vip"], max_tokens=12, priority=0))
    loop = Loop(sched, worker)
    loop.step()
    assert {r.request_id for r in sched.running} == {"old", "new", "vip"}
    victims = []
    while sched.has_unfinished:
        running = {r.request_id for r in sched.running}
        s, _ = loop.step()
        victims += [rid for rid in s.finished_ids if rid in running and rid in sched.requests]
    out = loop.out
    assert victims and victims[0] == "new"
    assert "vip" not in victims
    assert sched.num_preempted_total >= 1
    for rid, p in prompts.items():
        assert out[rid] == reference(p, 12), rid
    assert sched.bm.num_used_blocks == 0


def test_resumed_request_gets_its_output_so_far():
    sched, worker = setup(num_blocks=4, budget=64)
    sched.add_request(make_request("a", [1] * 7, max_tokens=8))
    sched.add_request(make_request("b", [2] * 7, max_tokens=8))
    resumed = []
    while sched.has_unfinished:
        s, _ = step(sched, worker)
        resumed += [seq for seq in s.new_sequences if seq.output_token_ids]
    assert resumed and resumed[0].request_id == "b"
    assert resumed[0].output_token_ids == reference([2] * 7, 8)[:len(resumed[0].output_token_ids)]


@pytest.mark.parametrize(("kwargs", "eos", "expect_reason", "cut"), [
    ({}, None, "length", 12),
    ({"ignore_eos": True}, "first", "length", 12),
    ({}, "first", "stop", 1),
    ({"min_tokens": 3}, "third", "stop", 3),
])
def test_stops(kwargs, eos, expect_reason, cut):
    prompt = [4, 4, 4]
    full = reference(prompt, 12)
    eos_id = {"first": full[0], "third": full[2], None: None}[eos]
    if eos == "third":
        assert full[2] not in full[:2]  # the synthetic sequence keeps the test meaningful
    sched, worker = setup()
    sched.add_request(make_request("a", prompt, max_tokens=12, eos=eos_id, **kwargs))
    deltas = []
    while sched.has_unfinished:
        deltas += step(sched, worker)[1]
    assert [d.new_token_ids[0] for d in deltas] == full[:cut]
    assert deltas[-1].finish_reason == expect_reason
    assert all(d.finish_reason is None for d in deltas[:-1])


def test_stop_token_ids_report_the_token():
    prompt = [9, 9]
    full = reference(prompt, 12)
    sched, worker = setup()
    sched.add_request(make_request("a", prompt, max_tokens=12, stop_token_ids=[full[1]]))
    deltas = []
    while sched.has_unfinished:
        deltas += step(sched, worker)[1]
    cut = full.index(full[1]) + 1
    assert len(deltas) == cut
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_token_id == full[1]


def test_context_length_stops_with_length():
    sched, worker = setup(max_model_len=10)
    sched.add_request(make_request("a", [1] * 7, max_tokens=50))
    out = drive(sched, worker)
    assert out["a"] == reference([1] * 7, 50, max_model_len=10)
    assert len(out["a"]) == 3


def test_abort_is_idempotent_frees_blocks_and_tells_workers():
    sched, worker = setup()
    sched.add_request(make_request("a", [1] * 9, max_tokens=30))
    sched.add_request(make_request("b", [2] * 9, max_tokens=30))
    step(sched, worker)
    used = sched.bm.num_used_blocks
    sched.add_request(make_request("w", [3] * 9, max_tokens=30))  # still waiting
    aborted = sched.abort(["a", "w", "nope"])
    assert [r.request_id for r in aborted] == ["a", "w"]
    assert all(r.finish_reason.value == "abort" and r.status is RequestStatus.FINISHED
               for r in aborted)
    assert sched.bm.num_used_blocks < used
    assert sched.abort(["a", "w"]) == []
    s, _ = step(sched, worker)
    assert s.finished_ids == ["a"]  # only running requests have worker state
    assert "a" not in worker.seqs
    sched.abort(["b"])
    assert sched.bm.num_used_blocks == 0 and not sched.has_unfinished


def test_duplicate_request_id_rejected():
    sched, _ = setup()
    sched.add_request(make_request("a", [1]))
    with pytest.raises(ValueError, match="'a' is already in the engine"):
        sched.add_request(make_request("a", [2]))


def test_many_requests_under_pressure_match_reference():
    rng = random.Random(7)
    sched, worker = setup(num_blocks=24, max_num_seqs=12, budget=32, max_model_len=64)
    expected = {}
    shared = [rng.randrange(97) for _ in range(8)]
    for i in range(60):
        prompt = (shared if i % 3 == 0 else []) + [rng.randrange(97)
                                                   for _ in range(rng.randint(1, 20))]
        n = rng.randint(1, 24)
        sched.add_request(make_request(f"r{i}", prompt, max_tokens=n, priority=i % 2))
        expected[f"r{i}"] = reference(prompt, n, max_model_len=64)
    out = drive(sched, worker)
    assert out == expected
    assert sched.num_preempted_total > 0
    assert sched.bm.hit_rate > 0
    assert sched.bm.num_used_blocks == 0


def test_pooling_inputs_run_whole_beside_generation_and_finish_with_their_vector():
    """An embedding input is never split (an encoder attends both ways): it waits for a step
    with room for all of it, while a generation prompt is chunked around it; it finishes in
    its step with its vector, frees its blocks, and never enters the prefix cache."""
    sched, worker = setup(budget=8)
    loop = Loop(sched, worker)
    long_prompt = list(range(1, 20))
    sched.add_request(make_request("gen", long_prompt, max_tokens=3))
    sched.add_request(make_request("emb", [3, 4, 5, 6, 7, 8], pooling=True))
    first, _ = loop.step()
    assert [(c.request_id, len(c.token_ids), c.pool) for c in first.chunks] == [("gen", 8, False)]
    loop.finish()
    assert loop.out["gen"] == reference(long_prompt, 3)
    [emb] = [d for d in loop.deltas if d.request_id == "emb"]
    assert emb.new_token_ids == [] and emb.finish_reason == "stop"
    assert emb.embedding == [pooled_value([3, 4, 5, 6, 7, 8])]
    assert sched.bm.num_used_blocks == 0
    # The same input again computes again: its blocks held no reusable KV.
    sched.add_request(make_request("emb2", [3, 4, 5, 6, 7, 8], pooling=True))
    loop.finish()
    [again] = [d for d in loop.deltas if d.request_id == "emb2"]
    assert again.num_cached_tokens == 0 and again.embedding == emb.embedding


def test_an_aborted_pooling_input_gets_no_vector():
    sched, worker = setup(budget=8)
    sched.add_request(make_request("emb", [3, 4, 5], pooling=True))
    step_in = sched.schedule()
    sched.abort(["emb"])
    assert sched.update(step_in, worker.execute(step_in)) == []
    assert sched.bm.num_used_blocks == 0
