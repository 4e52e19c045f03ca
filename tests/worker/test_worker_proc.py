"""One real worker process (tp=1) driven over a real transport: steps, calls, a malformed frame,
and a failing step whose traceback comes back while the worker exits through ERROR."""

from __future__ import annotations

import msgspec
import pytest

from aioengine.config import EngineConfig
from aioengine.messages.launch import WORKER_TARGET as TARGET
from aioengine.messages.launch import WorkerLaunch
from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import (
    NewSequence,
    ScheduledChunk,
    StepInput,
    WorkerCall,
    WorkerError,
)
from aioengine.runtime import ChildSpec, EngineStartupError, EventType, Supervisor
from aioengine.worker.worker_proc import make_worker_target
from tests.worker.step_driver import StepDriver
from tests.worker.worker_harness import WorkerFailed, WorkerHarness

BLOCK = 8
CONFIG = EngineConfig(model="tiny", device="cpu", dtype="float32", block_size=BLOCK,
                      max_num_seqs=4, max_model_len=256, kv_cache_memory_fraction=0.1)


@pytest.fixture(scope="module")
def worker():
    h = WorkerHarness(CONFIG, transport="uds")
    yield h
    h.close()


def test_ready_payload_and_calls(worker) -> None:
    ready = worker.ready["aioengine-worker-tp0"]
    # sized by need: 4 sequences x 256 / 8 blocks, plus 10% (rounded up) for the prefix cache
    assert ready["num_kv_blocks"] == 4 * 32 + 13 and ready["max_model_len"] == 256
    assert ready["kv_sized_by"] == "need: max_num_seqs=4 x 256 tokens + 10% prefix-cache share"
    # k and v x 4 layers x 8 tokens x 4 kv heads x 32: float16 with the decode kernel, else 32
    assert ready["kv_bytes_per_block"] in (2 * 4 * BLOCK * 4 * 32 * 2, 2 * 4 * BLOCK * 4 * 32 * 4)
    assert worker.call("ping") == "pong"
    report = worker.call("profile_memory")
    assert report["num_kv_blocks"] == 141 and report["bytes_per_block"] > 0


def test_steps_generate_greedy_tokens(worker) -> None:
    from aioengine.worker.model_runner import ModelRunner

    d = StepDriver(BLOCK, 128)
    p = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    d.add("a", p, SamplingParams(temperature=0.0))
    d.add("b", p[:4], SamplingParams(seed=3, logprobs=2))
    for budget in ({"a": 6}, None, None, None, None):
        d.apply(worker.execute(d.step(budget)))
    # The same steps in this process give the same tokens.
    local = ModelRunner(CONFIG)
    local.allocate_kv_cache(128)
    ref = StepDriver(BLOCK, 128)
    ref.add("a", p, SamplingParams(temperature=0.0))
    ref.add("b", p[:4], SamplingParams(seed=3, logprobs=2))
    for budget in ({"a": 6}, None, None, None, None):
        ref.apply(local.execute(ref.step(budget)))
    assert d.seqs["a"].outputs == ref.seqs["a"].outputs and len(d.seqs["a"].outputs) == 4
    assert d.seqs["b"].outputs == ref.seqs["b"].outputs and len(d.seqs["b"].outputs) == 4
    for rid in ("a", "b"):
        d.finish(rid)
    assert worker.execute(d.step()).sampled == []


def test_malformed_frame_and_unknown_call_are_answered_not_fatal(worker) -> None:
    worker.send(msgspec.msgpack.encode({"type": "step", "step_id": "not an int"}))
    with pytest.raises(WorkerFailed) as info:
        worker.reply()
    assert not info.value.error.fatal and info.value.error.exc_type == "ValidationError"
    worker.send(b"\xc1")  # never valid msgpack
    with pytest.raises(WorkerFailed, match="DecodeError"):
        worker.reply()
    worker.send(WorkerCall(77, "reboot"))
    with pytest.raises(WorkerFailed, match="unknown worker call 'reboot'"):
        worker.reply()
    assert worker.call("ping") == "pong"  # still alive


def test_failing_step_returns_traceback_and_worker_exits_through_error(worker) -> None:
    bad = StepInput(5, [NewSequence("x", [1, 2], [], SamplingParams())],
                    [ScheduledChunk("x", [1, 2], 0, [10**6], True)], [])
    worker.send(bad)
    with pytest.raises(WorkerFailed) as info:
        worker.reply()
    err: WorkerError = info.value.error
    assert err.fatal and err.rank == 0 and err.exc_type == "StepInputError"
    assert "block id 1000000 is outside the KV cache" in err.message
    assert "model_runner.py" in err.traceback and "_check_ids" in err.traceback
    assert worker.died.wait(60)
    assert worker.deaths == [("aioengine-worker-tp0", 1)]
    kinds = [e.type for e in worker.sup.events("aioengine-worker-tp0")]
    assert kinds[-3:] == [EventType.ERROR, EventType.SHUTDOWN, EventType.DEAD]
    assert "StepInputError" in worker.sup.error("aioengine-worker-tp0").traceback


def test_launch_validation() -> None:
    with pytest.raises(ValueError, match="rank must be in"):
        WorkerLaunch(CONFIG, 1, 1, "shm", "shm")
    with pytest.raises(ValueError, match="differs from the config's tensor_parallel_size"):
        WorkerLaunch(CONFIG, 0, 2, "shm", "shm", "127.0.0.1:1")
    with pytest.raises(ValueError, match="dist_init_addr"):
        WorkerLaunch(CONFIG.replace(tensor_parallel_size=2), 0, 2, "shm", "shm")
    with pytest.raises(ValueError, match="malformed WorkerLaunch"):
        make_worker_target(b"\x93\x01\x02")


def test_startup_failure_is_reported() -> None:
    """A worker that cannot start reports ERROR with its traceback (and leaves nothing)."""
    with Supervisor() as sup, pytest.raises(EngineStartupError) as info:
        sup.start([ChildSpec("aioengine-worker-tp0", TARGET, b"\x93\x01\x02")], 120)
    assert "malformed WorkerLaunch" in str(info.value)
    assert info.value.child_traceback and "make_worker_target" in info.value.child_traceback
