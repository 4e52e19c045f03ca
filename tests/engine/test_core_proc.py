"""The engine process (uniproc executor) over a real shared-memory transport."""

import os
import time

import msgspec
import psutil
import pytest

from aioengine.messages import AbortRequests, AddRequest, EngineStats, SamplingParams
from aioengine.runtime import EventType

from .conftest import small_config
from .engine_harness import NAME, EngineHarness
from .workload import assert_same_greedy, workload


@pytest.fixture(scope="module")
def engine(one_thread):
    h = EngineHarness(small_config(), transport="shm")
    yield h
    h.close()
    # The engine left its loop because we closed the channels: a clean exit, never a kill.
    assert h.sup.exitcode(NAME) == 0
    assert [e.type for e in h.sup.events(NAME)][-2:] == [EventType.SHUTDOWN, EventType.DEAD]


def test_ready_payload(engine, vocab_size):
    ready = dict(engine.ready)
    dtype_bytes = {"float16": 2, "float32": 4}[ready.pop("kv_dtype")]
    # k and v x 4 layers x 4 tokens x 4 kv heads x 32
    assert ready.pop("kv_bytes_per_block") == 2 * 4 * 4 * 4 * 32 * dtype_bytes
    assert ready == {"num_kv_blocks": 40, "max_model_len": 96, "block_size": 4,
                     "eos_token_id": 1, "vocab_size": vocab_size,
                     "kv_sized_by": "num_kv_blocks=40", "task": "generate"}


def test_300_requests_match_each_run_alone(engine, vocab_size, alone_reference):
    got = engine.run(workload(vocab_size))
    assert_same_greedy(got, alone_reference)
    stats = msgspec.convert(engine.call("get_stats").result, EngineStats)
    assert stats.kv_blocks_used == 0 and stats.num_preempted_total > 0
    assert stats.num_requests_finished_total >= 300


def test_utilities(engine):
    assert engine.call("ping").result == "pong"
    assert engine.call("reset_prefix_cache").result is True
    assert msgspec.convert(engine.call("get_stats").result, EngineStats).kv_blocks_total == 40
    bad = engine.call("launch_missiles")
    assert bad.result is None
    assert bad.error == ("unknown utility method 'launch_missiles'; known: "
                         "['get_stats', 'reset_prefix_cache', 'ping']")


def test_malformed_frames_are_dropped_and_the_engine_goes_on(engine):
    engine.send(b"\xc1 not msgpack")
    engine.send(msgspec.msgpack.encode({"type": "nonsense"}))
    assert engine.call("ping").result == "pong"
    assert engine.sup.exitcode(NAME) is None


def test_invalid_request_fields_get_an_error_output(engine):
    frame = msgspec.msgpack.encode({"type": "add", "request_id": "badtemp",
                                    "prompt_token_ids": [5, 6], "arrival_time": 0.0,
                                    "params": {"temperature": -1.0}})
    engine.send(frame)
    outs = engine.run([AddRequest("ok", [5, 6], SamplingParams(max_tokens=2), time.time())])
    assert outs["ok"].finish_reason == "length"
    bad = engine.others["badtemp"]
    assert bad.finish_reason == "error" and bad.tokens == []
    assert bad.error.startswith("invalid request: temperature must be in [0.0, 100.0], got -1.0")


def test_abort_over_the_wire(engine):
    reqs = [AddRequest(f"ab{i}", [5 + i] * 20, SamplingParams(max_tokens=60, ignore_eos=True,
                                                              temperature=0.0), time.time())
            for i in range(4)]
    outs = engine.run(reqs, abort=["ab1", "ab3", "never-existed"])
    assert outs["ab1"].finish_reason == outs["ab3"].finish_reason == "abort"
    assert outs["ab0"].finish_reason == outs["ab2"].finish_reason == "length"
    assert len(outs["ab0"].tokens) == 60
    engine.send(AbortRequests(["ab0"]))  # finished already: ignored
    stats = msgspec.convert(engine.call("get_stats").result, EngineStats)
    assert stats.kv_blocks_used == 0 and stats.num_running == 0


def test_idle_engine_uses_under_2_percent_cpu(engine):
    proc = psutil.Process(engine.pid)
    engine.call("ping")
    time.sleep(0.5)
    t0, c0 = time.monotonic(), proc.cpu_times()
    time.sleep(3.0)
    t1, c1 = time.monotonic(), proc.cpu_times()
    used = (c1.user + c1.system) - (c0.user + c0.system)
    assert used / (t1 - t0) < 0.02, f"idle engine used {used:.3f} s CPU in {t1 - t0:.1f} s"


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies only")
def test_io_threads_are_batch_so_their_wakeups_never_preempt_the_model(engine):
    engine.call("ping")  # both I/O threads have run
    pid = engine.pid
    policies = {int(t): os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}
    assert policies[pid] == os.SCHED_OTHER  # the main thread runs the model: left as it is
    batch = [t for t, p in policies.items() if p == os.SCHED_BATCH]
    assert len(batch) == 2, f"want engine-input and engine-output batch, got {policies}"


def test_engine_modules_import_no_torch():
    """The engine process imports ``core_proc``; the mp engine process also
    runs the core and the mp executor: none of them may pull torch in at import."""
    import subprocess
    import sys

    code = ("import sys, aioengine.engine.core_proc, aioengine.engine.core, "
            "aioengine.engine.executor.mp; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "False"
