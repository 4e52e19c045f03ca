"""One-step-ahead scheduling (``Executor.supports_lookahead``): the engine submits each decode
step before the previous result is back. Outputs must equal plain scheduling in every case the
lookahead meets: stops in flight (the extra token is dropped), aborts in flight, arrivals,
running out of blocks; and over the real mp executor against the uniproc one."""

from __future__ import annotations

import time
from collections import deque

import msgspec
import pytest

from aioengine.engine.core import EngineCore
from aioengine.engine.executor.base import Executor, ExecutorInfo
from aioengine.messages import AddRequest, SamplingParams, StepInput, StepResult
from aioengine.messages.worker_io import PREVIOUS_TOKEN

from .conftest import small_config
from .sim_worker import VOCAB, SimWorker, reference
from .workload import Output, assert_same_greedy, run_core, workload

BS = 4


class QueuedSim(Executor):
    """The synthetic worker behind a step queue, as a worker process is: each submitted step
    runs at once (so it may run before the engine has seen the previous result), results are
    collected in order. ``[PREVIOUS_TOKEN]`` is the last token sampled for the sequence."""

    supports_lookahead = True

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.worker = SimWorker(num_blocks, BS)
        self.results: deque[StepResult] = deque()
        self.placeholders = 0

    def start(self) -> ExecutorInfo:
        return ExecutorInfo(num_kv_blocks=self.num_blocks)

    def execute(self, step: StepInput) -> StepResult:
        chunks = []
        for c in step.chunks:
            if c.token_ids == [PREVIOUS_TOKEN]:
                self.placeholders += 1
                c = msgspec.structs.replace(c, token_ids=[self.worker.seqs[c.request_id][-1]])
            chunks.append(c)
        return self.worker.execute(msgspec.structs.replace(step, chunks=chunks))

    def submit(self, step: StepInput) -> None:
        self.results.append(self.execute(step))

    def collect(self, step: StepInput) -> StepResult:
        result = self.results.popleft()
        assert result.step_id == step.step_id
        return result

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def sim_core(num_blocks: int = 64, **changes) -> tuple[EngineCore, QueuedSim]:
    sim = QueuedSim(num_blocks)
    changes.setdefault("max_model_len", 128)
    config = small_config(num_kv_blocks=num_blocks, block_size=BS, **changes)
    return EngineCore(config, sim), sim


def add(core: EngineCore, rid: str, prompt: list[int], max_tokens: int, eos: int | None = None,
        **params) -> None:
    # eos_token_id outside VOCAB never stops: the synthetic worker samples below VOCAB
    core.add_request(AddRequest(rid, prompt, SamplingParams(max_tokens=max_tokens,
                                                            temperature=0.0, **params),
                                time.time(), eos_token_id=VOCAB + 1 if eos is None else eos))


def finish(core: EngineCore, outs: dict[str, Output]) -> None:
    for _ in range(10_000):
        if not core.has_work():
            return
        for d in core.step():
            outs.setdefault(d.request_id, Output()).add(d)
    raise AssertionError("did not finish")


def test_outputs_equal_plain_scheduling_with_stops_in_flight():
    core, sim = sim_core()
    stop_at = reference([30, 31], 50)[6]  # a token the request meets after a few decodes
    prompts = {"long": [5, 6, 7], "one": [8], "two": [9, 10], "eos": [30, 31],
               "stop": [40, 41, 42]}
    add(core, "long", prompts["long"], 40)
    add(core, "one", prompts["one"], 1)
    add(core, "two", prompts["two"], 2)
    add(core, "eos", prompts["eos"], 50, eos=stop_at)
    stop_tok = reference(prompts["stop"], 50)[4]
    add(core, "stop", prompts["stop"], 50, stop_token_ids=[stop_tok])
    outs: dict[str, Output] = {}
    finish(core, outs)
    assert outs["long"].tokens == reference(prompts["long"], 40)
    assert outs["one"].tokens == reference(prompts["one"], 1)
    assert outs["two"].tokens == reference(prompts["two"], 2)
    assert outs["eos"].tokens == reference(prompts["eos"], 50, eos=stop_at)
    assert outs["eos"].tokens[-1] == stop_at and outs["eos"].finish_reason == "stop"
    assert outs["stop"].tokens == reference(prompts["stop"], 50, stop_ids=(stop_tok,))
    assert outs["long"].finish_reason == "length"
    assert sim.placeholders >= 30  # the long request decoded one step ahead nearly throughout
    assert core.block_manager.num_used_blocks == 0 and not core.scheduler.requests


def test_abort_in_flight_and_arrivals_mid_stream():
    core, sim = sim_core()
    add(core, "a", [5, 6, 7], 30)
    add(core, "b", [50, 51], 30)
    outs: dict[str, Output] = {}
    for _ in range(5):
        for d in core.step():
            outs.setdefault(d.request_id, Output()).add(d)
    assert core._inflight is not None  # a step is in flight while the abort comes in
    core.abort(["a"])
    add(core, "c", [60, 61, 62], 10)  # arrives while lookahead runs: admitted next
    finish(core, outs)
    assert outs["a"].finish_reason == "abort"
    assert outs["a"].tokens == reference([5, 6, 7], 30)[:len(outs["a"].tokens)]
    assert outs["b"].tokens == reference([50, 51], 30)
    assert outs["c"].tokens == reference([60, 61, 62], 10)
    assert sim.placeholders > 0
    assert core.block_manager.num_used_blocks == 0 and not core.scheduler.requests


def test_running_out_of_blocks_falls_back_to_preemption():
    # 12 blocks of 4: three 30-token requests cannot all fit, so they preempt and recompute.
    core, sim = sim_core(num_blocks=12, max_num_batched_tokens=64, max_model_len=48)
    prompts = {f"p{i}": [70 + i, 71, 72] for i in range(3)}
    for rid, p in prompts.items():
        add(core, rid, p, 27)
    outs: dict[str, Output] = {}
    finish(core, outs)
    for rid, p in prompts.items():
        assert outs[rid].tokens == reference(p, 27), rid
    assert core.scheduler.num_preempted_total > 0 and sim.placeholders > 0
    assert core.block_manager.num_used_blocks == 0


def test_no_lookahead_without_the_executor_saying_so():
    core, sim = sim_core()
    sim.supports_lookahead = False
    add(core, "a", [5, 6, 7], 10)
    outs: dict[str, Output] = {}
    finish(core, outs)
    assert outs["a"].tokens == reference([5, 6, 7], 10) and sim.placeholders == 0


@pytest.mark.parametrize("transport", ["uds"])
def test_mp_executor_one_rank_matches_uniproc(one_thread, core, vocab_size, transport):
    reqs = workload(vocab_size, n=24, prefix="w") + [
        AddRequest(f"long{i}", [10 + i, 11, 12], SamplingParams(
            max_tokens=40, temperature=0.0, ignore_eos=i % 2 == 0, logprobs=5), time.time())
        for i in range(3)]
    expected = run_core(core, reqs)  # uniproc: no lookahead
    mp = EngineCore(small_config(executor="mp", transport=transport))
    try:
        assert mp.executor.supports_lookahead
        sched = mp.scheduler
        real, ahead = sched.schedule_ahead, []

        def counting(inflight):
            step = real(inflight)
            ahead.append(step is not None)
            return step

        sched.schedule_ahead = counting
        got = run_core(mp, reqs)
        assert sum(ahead) >= 20  # the long requests decoded one step ahead
        assert_same_greedy(got, expected)
        assert mp.get_stats().kv_blocks_used == 0
    finally:
        mp.shutdown()
