"""The mp executor: worker processes under the engine, steps broadcast over a transport."""

import signal
import time

import msgspec
import psutil
import pytest

from aioengine.engine.executor import ExecutorError
from aioengine.messages import (
    AddRequest,
    EngineStats,
    NewSequence,
    SamplingParams,
    ScheduledChunk,
    StepInput,
    StepOutputs,
)
from aioengine.runtime import EventType

from .conftest import small_config
from .engine_harness import NAME, EngineHarness
from .workload import Output, assert_same_greedy, run_core, workload

LONG_TOKENS = 1000
KILL_CONFIG = dict(max_model_len=LONG_TOKENS + 8, num_kv_blocks=3 * (LONG_TOKENS + 8) // 4 + 4)
"""An engine whose three requests of ``LONG_TOKENS`` each take a thousand steps: a kill test's
margin against the engine finishing them while the test process waits for a CPU."""


def long_requests(n: int, tag: str = "") -> list[AddRequest]:
    params = SamplingParams(max_tokens=LONG_TOKENS, temperature=0.0, ignore_eos=True)
    return [AddRequest(f"long{tag}{i}", [10 + i, 11, 12], params, time.time()) for i in range(n)]


def collect(h: EngineHarness, outs: dict[str, Output]) -> None:
    msg = h.recv()
    if isinstance(msg, StepOutputs):
        for d in msg.outputs:
            outs[d.request_id].add(d)


def kill_worker_mid_generation(h: EngineHarness, rank: int, world: int) -> None:
    """SIGKILL one worker while requests run: every request fails with an error naming the
    worker, an EngineFailure arrives, and the engine exits through ERROR with no process left.

    The state the kill needs -- every request running -- is waited for, not raced: once each
    request has produced a token the worker is stopped (SIGSTOP), so the engine can take them
    no further than the step in flight; then it is killed."""
    workers = h.workers()
    assert len(workers) == world
    reqs = long_requests(3)
    for r in reqs:
        h.send(r)
    outs = {r.request_id: Output() for r in reqs}
    while not all(o.tokens for o in outs.values()):
        collect(h, outs)
    victim = workers[rank]
    victim.suspend()
    assert not any(o.finish_reason for o in outs.values()), "finished before the worker stopped"
    victim.send_signal(signal.SIGKILL)
    # EngineFailure comes first (clients fail every stream at once), the per-request errors next;
    # the engine sends both before it exits (``core_proc``'s last words), so a PeerClosedError
    # here means they were lost.
    while not h.failures or not all(o.finish_reason for o in outs.values()):
        collect(h, outs)
    for o in outs.values():
        assert o.finish_reason == "error" and "worker" in o.error, o.error
        assert len(o.tokens) < LONG_TOKENS
    assert "worker" in h.failures[0].message
    if world == 1:  # the engine waits for the death report: the cause is named
        assert "SIGKILL" in h.failures[0].message, h.failures[0].message
    # (with ranks, the survivor's collective may fail first: its error names the closed peer)
    assert h.died.wait(60)
    assert h.deaths == [(NAME, 1)]
    assert EventType.ERROR in [e.type for e in h.sup.events(NAME)]
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive


def test_engine_process_mp_one_rank(one_thread, vocab_size, alone_reference, transport="zmq"):
    h = EngineHarness(small_config(executor="mp"), transport=transport)
    try:
        assert h.ready["num_kv_blocks"] == 40
        assert h.ready["kv_sized_by"] == "num_kv_blocks=40"  # what the worker was told
        got = h.run(workload(vocab_size))
        assert_same_greedy(got, alone_reference)
        stats = msgspec.convert(h.call("get_stats").result, EngineStats)
        assert stats.kv_blocks_used == 0 and stats.num_preempted_total > 0
        assert {p.role for p in stats.processes} == {"engine", "aioengine-worker-tp0"}
    finally:
        h.close()


def test_worker_killed_mid_generation_fails_every_request(one_thread, transport="zmq"):
    h = EngineHarness(small_config(executor="mp", **KILL_CONFIG), transport=transport)
    try:
        kill_worker_mid_generation(h, 0, world=1)
    finally:
        h.close()


@pytest.mark.slow
def test_engine_process_mp_tensor_parallel_2(one_thread, vocab_size, alone_reference):
    h = EngineHarness(small_config(executor="mp", tensor_parallel_size=2), transport="uds")
    try:
        got = h.run(workload(vocab_size))
        assert_same_greedy(got, alone_reference)
        stats = msgspec.convert(h.call("get_stats").result, EngineStats)
        assert stats.kv_blocks_used == 0
    finally:
        h.close()
    h = EngineHarness(small_config(executor="mp", tensor_parallel_size=2, **KILL_CONFIG),
                      transport="uds")
    try:
        kill_worker_mid_generation(h, 1, world=2)  # rank 0 is left waiting in a collective
    finally:
        h.close()


@pytest.mark.slow
def test_core_in_process_tensor_parallel_2_and_a_raising_worker(one_thread, vocab_size,
                                                                 alone_reference):
    from aioengine.engine.core import EngineCore

    core = EngineCore(small_config(tensor_parallel_size=2, transport="shm"))
    try:
        assert core.config.resolved_executor == "mp"
        got = run_core(core, workload(vocab_size))
        assert_same_greedy(got, alone_reference)
        assert core.get_stats().kv_blocks_used == 0
        # A worker that raises: a step naming a block past the cache (an engine bug) reaches
        # the workers, rank 0 answers with its traceback, the executor raises.
        bad = StepInput(10**6, [NewSequence("x", [5], [], SamplingParams())],
                        [ScheduledChunk("x", [5], 0, [10**5], True)], [])
        with pytest.raises(ExecutorError, match=r"(?s)StepInputError.*block id 100000 is "
                                                r"outside the KV cache of 40 blocks.*Traceback"):
            core.executor.execute(bad)
    finally:
        core.shutdown()
