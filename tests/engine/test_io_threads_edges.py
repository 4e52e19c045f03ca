"""The I/O threads' CPU following against what the world does to a real engine process: started
confined to one CPU (``taskset``), its CPU mask changed from outside while it decodes, an abort
while decoding (the input thread shares the model's CPU), SIGTERM and a client leaving
mid-stream; and a thread id the kernel gave to a stranger after its I/O thread ended."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from aioengine.messages import AbortRequests, AddRequest, SamplingParams, StepOutputs

from .conftest import small_config
from .engine_harness import EngineHarness

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity")
                                or not hasattr(os, "SCHED_BATCH"),
                                reason="Linux scheduling only")
ALLOWED = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two usable CPUs")
PROMPT = [5, 6, 7]


def _add(rid: str, tokens: int) -> AddRequest:
    return AddRequest(rid, PROMPT, SamplingParams(max_tokens=tokens, ignore_eos=True,
                                                 temperature=0.0), time.time())


def _tokens(engine: EngineHarness, rid: str, tokens: int, during=None) -> list[int]:
    """Greedy tokens for one request; ``during(count)`` is called after each frame."""
    engine.send(_add(rid, tokens))
    got: list[int] = []
    while len(got) < tokens:
        msg = engine.recv()
        if isinstance(msg, StepOutputs):
            got += [t for d in msg.outputs if d.request_id == rid for t in d.new_token_ids]
            if during is not None:
                during(len(got))
    return got


def _start_decoding(engine: EngineHarness, rid: str) -> None:
    """Send a 500-token request and return once 20 of its tokens have come back."""
    engine.send(_add(rid, 500))
    count = 0
    while count < 20:
        msg = engine.recv()
        if isinstance(msg, StepOutputs):
            count += sum(len(d.new_token_ids) for d in msg.outputs)


def _io_cpus(pid: int) -> list[set[int]]:
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return [os.sched_getaffinity(t) for t in tids if os.sched_getscheduler(t) == os.SCHED_BATCH]


@pytest.fixture(scope="module")
def reference(one_thread) -> list[int]:
    """The greedy tokens with the I/O threads left anywhere."""
    engine = EngineHarness(small_config(colocate_io_threads=False), transport="uds")
    try:
        return _tokens(engine, "ref", 48)
    finally:
        engine.close()


@linux_only
@two_cpus
def test_an_engine_started_on_one_cpu_keeps_everything_there(one_thread, reference):
    """As under ``taskset -c N``: the process may use one CPU (a 1-CPU host looks the same)."""
    cpu = max(ALLOWED)
    os.sched_setaffinity(0, {cpu})  # the spawned engine inherits this thread's mask
    try:
        engine = EngineHarness(small_config(), transport="uds")
    finally:
        os.sched_setaffinity(0, ALLOWED)
    try:
        assert _tokens(engine, "r", 48) == reference
        assert _io_cpus(engine.pid) == [{cpu}, {cpu}]
        assert os.sched_getaffinity(engine.pid) == {cpu}
        assert engine.call("ping").result == "pong"
    finally:
        engine.close()


@linux_only
@two_cpus
def test_a_cpu_mask_changed_from_outside_while_decoding_is_followed(one_thread, reference):
    engine = EngineHarness(small_config(), transport="uds")
    pid = engine.pid
    moved: list[int] = []

    def move(count: int) -> None:
        if count >= 16 and not moved:  # the loop (main thread) is sent to another CPU
            (now,) = _io_cpus(pid)[0]
            moved.append(min(ALLOWED - {now}))
            os.sched_setaffinity(pid, {moved[0]})

    try:
        assert _tokens(engine, "r", 48, during=move) == reference
        # The threads follow at the loop's next hand-over. On a loaded box the engine may have
        # run all 48 steps before the move landed (this process reads behind it): one more
        # request makes sure a step with output comes after the move.
        assert moved
        assert _tokens(engine, "r1", 2) == reference[:2]
        assert _io_cpus(pid) == [{moved[0]}, {moved[0]}]
        os.sched_setaffinity(pid, ALLOWED)  # and given back every CPU
        assert _tokens(engine, "r2", 48) == reference
        (cpus_a, cpus_b) = _io_cpus(pid)
        assert len(cpus_a) == 1 and cpus_a == cpus_b
    finally:
        engine.close()


@linux_only
def test_an_abort_while_decoding_takes_effect_at_once(one_thread):
    """The input thread runs on the model's CPU and only gets it when the loop hands it over:
    the abort must still land within a step or two, not after the request's end."""
    engine = EngineHarness(small_config(max_model_len=600, num_kv_blocks=160), transport="uds")
    try:
        engine.send(_add("long", 500))
        got = finish = None
        count = 0
        while finish is None:
            msg = engine.recv()
            if not isinstance(msg, StepOutputs):
                continue
            for d in msg.outputs:
                count += len(d.new_token_ids)
                finish = d.finish_reason or finish
            if count >= 20 and got is None:
                engine.send(AbortRequests(["long"]))
                got = count
        # Not after the request's end (that would be "length" at 500 tokens); the margin is wide
        # because a loaded box may keep the input thread off the CPU for many steps.
        assert finish == "abort"
        assert count - got < 400, f"{count - got} tokens after the abort was sent"
    finally:
        engine.close()


@linux_only
def test_sigterm_while_decoding_ends_the_engine_promptly(one_thread):
    engine = EngineHarness(small_config(max_model_len=600, num_kv_blocks=160), transport="uds")
    try:
        _start_decoding(engine, "long")
        os.kill(engine.pid, signal.SIGTERM)
        assert engine.died.wait(30), "the engine ignored SIGTERM while decoding"
        assert engine.deaths and engine.deaths[0][1] == 0, engine.deaths
    finally:
        engine.close()


@linux_only
def test_closing_the_channels_while_decoding_stops_the_engine(one_thread):
    """As a client that goes away mid-stream: the output thread ends on the closed channel
    while the loop still steps and hands over to it (a thread that ended is skipped)."""
    engine = EngineHarness(small_config(max_model_len=600, num_kv_blocks=160), transport="uds")
    try:
        _start_decoding(engine, "long")
        engine.requests.close()
        engine.outputs.close()
        assert engine.died.wait(30), "the engine kept running after its client left"
        assert engine.deaths[0][1] == 0, engine.deaths
    finally:
        engine.close()


# In a PID namespace of its own (``unshare -p -f``), where ``ns_last_pid`` decides the next id:
# an I/O thread ends, its thread id goes to a new process, then the loop moves CPU.
TID_REUSE = """
import os, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from aioengine.engine.io_threads import ModelCpuFollower
allowed = os.sched_getaffinity(0)
first, second = sorted(allowed)[:2]
stop, end = threading.Event(), threading.Event()
parked, ending = threading.Thread(target=stop.wait), threading.Thread(target=end.wait)
parked.start(); ending.start()
os.sched_setaffinity(0, {first})
follower = ModelCpuFollower([ending, parked])
tid = ending.native_id
end.set(); ending.join()
while True:  # join() returns a moment before the kernel frees the id
    try:
        os.sched_getaffinity(tid)
    except ProcessLookupError:
        break
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(tid - 1))
os.sched_setaffinity(0, allowed)  # the stranger does not inherit the loop's one CPU
stranger = subprocess.Popen(["sleep", "60"])
try:
    assert stranger.pid == tid, ("no reuse", stranger.pid, tid)
    os.sched_setaffinity(0, {second})  # the OS moves the loop
    follower.hand_over()
    print("stranger", sorted(os.sched_getaffinity(stranger.pid)), "allowed", sorted(allowed))
    print("parked", sorted(os.sched_getaffinity(parked.native_id)))
finally:
    stranger.kill(); stranger.wait(); stop.set()
"""


@linux_only
@two_cpus
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a PID namespace")
def test_a_thread_id_reused_after_its_thread_ended_is_not_pinned():
    """A thread id is recycled once its thread ends: following it would pin a stranger (another
    process of this user) to the loop's CPU."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(["unshare", "-p", "-f", sys.executable, "-c", TID_REUSE, root],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    second = sorted(ALLOWED)[1]
    assert lines["parked"] == str([second])  # the live thread still follows the loop
    stranger, allowed = lines["stranger"].split(" allowed ")
    assert stranger == allowed, proc.stdout
