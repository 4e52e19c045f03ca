"""Hypothesis: random schedules of add / step / abort never leak or over-free a block, and
every request that finishes on its own produces exactly its solo output."""

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioengine.engine.block_manager import BlockManager
from aioengine.engine.scheduler import Scheduler

from .sim_worker import SimWorker, make_request, reference

BS = 4
MAX_LEN = 48

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 5), min_size=1, max_size=30),
              st.integers(1, 16), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 40)),
    st.just(("reset",)),
), max_size=60)


def check_counts(sched: Scheduler) -> None:
    bm = sched.bm
    held = Counter(b for r in sched.requests.values() for b in r.block_ids)
    for b in range(bm.num_blocks):
        assert bm.ref_count(b) == held.get(b, 0) >= 0
    assert bm.num_used_blocks == len(held)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, num_blocks=st.integers(12, 40), budget=st.integers(1, 40),
       max_num_seqs=st.integers(1, 8), chunked=st.booleans())
def test_random_schedules_never_leak_blocks(ops, num_blocks, budget, max_num_seqs, chunked):
    bm = BlockManager(num_blocks, BS)
    sched = Scheduler(bm, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=budget if chunked else MAX_LEN,
                      max_model_len=MAX_LEN, enable_chunked_prefill=chunked)
    worker = SimWorker(num_blocks, BS)
    expected, out, finished, aborted = {}, {}, {}, set()
    n = 0

    def run_step():
        s = sched.schedule()
        for d in sched.update(s, worker.execute(s)):
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
            if d.finish_reason:
                finished[d.request_id] = d.finish_reason
        check_counts(sched)

    for op in ops:
        if op[0] == "add":
            _, body, max_tokens, priority, shared = op
            prompt = ([1, 2, 3, 4, 5, 0, 1, 2] if shared else []) + body
            rid = f"r{n}"
            n += 1
            sched.add_request(make_request(rid, prompt, max_tokens, priority=priority))
            expected[rid] = reference(prompt, max_tokens, max_model_len=MAX_LEN)
        elif op[0] == "step":
            for _ in range(op[1]):
                run_step()
        elif op[0] == "abort":
            rid = f"r{op[1]}"
            if rid in sched.requests:
                aborted.add(rid)
            sched.abort([rid])
        else:
            bm.reset_prefix_cache()
        check_counts(sched)

    for _ in range(2000):
        if not sched.has_unfinished:
            break
        run_step()
    assert not sched.has_unfinished
    assert bm.num_used_blocks == 0
    for rid, tokens in expected.items():
        if rid not in aborted:
            assert finished[rid] == "length"
            assert out[rid] == tokens, rid
        else:
            assert out.get(rid, []) == tokens[:len(out.get(rid, []))], rid
