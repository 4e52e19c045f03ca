"""Tensor parallelism 2 on CPU: two real worker processes (gloo) driven over a real transport
give the same greedy tokens as one rank; a SIGKILLed rank is seen without a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest

from aioengine.config import EngineConfig
from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import StepResult
from aioengine.worker.model_runner import ModelRunner
from tests.worker.step_driver import StepDriver
from tests.worker.worker_harness import WorkerDied, WorkerFailed, WorkerHarness
from transports import PeerClosedError

BLOCK = 8
BLOCKS = 64
CONFIG = EngineConfig(model="tiny", device="cpu", dtype="float32", block_size=BLOCK,
                      num_kv_blocks=BLOCKS, max_model_len=512)
GREEDY = SamplingParams(temperature=0.0, logprobs=2)
PROMPTS = {"a": [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42],
           "b": [500, 7, 91, 1200, 64],
           "c": [3, 1000, 17, 250, 250, 250, 8, 9]}


@pytest.fixture(scope="module")
def tp2():
    h = WorkerHarness(CONFIG.replace(tensor_parallel_size=2), transport="zmq")
    yield h
    h.close()


def drive(execute) -> StepDriver:
    """The same mixed schedule for both runs: chunked prefill beside decodes, a late arrival."""
    d = StepDriver(BLOCK, BLOCKS)
    d.add("a", PROMPTS["a"], GREEDY)
    d.add("b", PROMPTS["b"], GREEDY)
    d.apply(execute(d.step({"a": 5, "b": 100})))
    d.add("c", PROMPTS["c"], GREEDY)
    d.apply(execute(d.step({"a": 5, "b": 1, "c": 100})))
    for _ in range(8):
        d.apply(execute(d.step()))
    return d


def test_tp2_greedy_equals_tp1(tp2) -> None:
    payloads = [tp2.ready[f"aioengine-worker-tp{r}"] for r in range(2)]
    assert [p["rank"] for p in payloads] == [0, 1]
    assert all(p["num_kv_blocks"] == BLOCKS for p in payloads)
    got = drive(tp2.execute)

    one = ModelRunner(CONFIG)
    one.allocate_kv_cache(BLOCKS)
    want = drive(one.execute)
    one.release()
    for rid in PROMPTS:
        assert len(got.seqs[rid].outputs) >= 8
        assert got.seqs[rid].outputs == want.seqs[rid].outputs, rid


def test_tp2_logprobs_match_tp1(tp2) -> None:
    d = StepDriver(BLOCK, BLOCKS)
    d.add("l", PROMPTS["c"], GREEDY)
    step = d.step()
    two = tp2.execute(step).sampled[0].logprob
    one_runner = ModelRunner(CONFIG)
    one_runner.allocate_kv_cache(BLOCKS)
    one = one_runner.execute(step).sampled[0].logprob
    one_runner.release()
    assert two is not None and one is not None
    assert two.token_id == one.token_id
    assert two.logprob == pytest.approx(one.logprob, abs=1e-4)
    assert [t for t, _ in two.top] == [t for t, _ in one.top]
    d.finish("l")
    tp2.execute(d.step())


def test_sigkill_of_a_rank_mid_step_is_seen_without_hang(tp2) -> None:
    assert tp2.call("ping") == "pong"
    d = StepDriver(BLOCK, BLOCKS)
    d.add("z", list(range(100, 500)), GREEDY)  # a long prefill: both ranks busy in the forward
    step = d.step()
    tp2.send(step)
    os.kill(tp2.sup.pid("aioengine-worker-tp1"), signal.SIGKILL)
    # Rank 0's collective fails when its peer's connection drops: it answers with a fatal
    # WorkerError and exits through ERROR. On a loaded box this process can be preempted
    # between the send and the kill for longer than the prefill takes: then both ranks finish
    # the step, rank 0 returns its result, and the death must show on the next step instead,
    # either on its send (the broadcast writer's PeerClosedError for the dead rank) or in its
    # forward's collective (WorkerFailed). Either way, well before any collective timeout:
    # each reply gives up after 60 s (a TimeoutError, which fails the test), half the
    # collectives' 120 s timeout.
    with pytest.raises((WorkerFailed, WorkerDied, PeerClosedError)) as info:
        first = tp2.reply(timeout=60)  # reply() itself never raises PeerClosedError
        # Only reached if the step finished before the kill landed.
        assert isinstance(first, StepResult) and first.step_id == step.step_id, first
        d.apply(first)
        tp2.send(d.step())  # a decode step: rank 0's forward needs rank 1
        tp2.reply(timeout=60)
    assert tp2.died.wait(60)  # a hang guard (loaded box): the supervisor saw the SIGKILL
    assert ("aioengine-worker-tp1", -signal.SIGKILL) in tp2.deaths
    if isinstance(info.value, WorkerFailed):
        assert info.value.error.rank == 0 and info.value.error.fatal
        deadline = time.monotonic() + 60  # a hang guard: rank 0 exits through ERROR
        while ("aioengine-worker-tp0", 1) not in tp2.deaths and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ("aioengine-worker-tp0", 1) in tp2.deaths
