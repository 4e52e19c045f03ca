"""The engine's I/O threads follow the model loop's CPU (uniproc on CPU), real threads and a real
engine process: where they run, that the loop itself is never pinned, that each step's output
still leaves at once, and that nothing changes where it should not (mp, the option off)."""

from __future__ import annotations

import os
import queue
import threading
import time

import pytest

from aioengine.engine import io_threads
from aioengine.engine.io_threads import ModelCpuFollower
from aioengine.messages import AddRequest, SamplingParams, StepOutputs

from .conftest import small_config
from .engine_harness import EngineHarness

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity")
                                or not hasattr(os, "SCHED_BATCH"),
                                reason="Linux scheduling only")
ALLOWED = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two usable CPUs")


@pytest.fixture
def sleepers():
    """Two real threads parked on an event, as the I/O threads park in their waits."""
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait, name=f"io-{i}") for i in range(2)]
    for t in threads:
        t.start()
    yield threads
    stop.set()
    for t in threads:
        t.join(timeout=10)


@linux_only
@two_cpus
def test_threads_follow_the_loop_from_cpu_to_cpu(sleepers):
    first, second = sorted(ALLOWED)[:2]
    try:
        os.sched_setaffinity(0, {first})  # this thread plays the loop
        follower = ModelCpuFollower(sleepers)
        assert follower.active
        assert [os.sched_getaffinity(t.native_id) for t in sleepers] == [{first}, {first}]
        os.sched_setaffinity(0, {second})  # the OS moves the loop
        follower.hand_over()
        assert [os.sched_getaffinity(t.native_id) for t in sleepers] == [{second}, {second}]
    finally:
        os.sched_setaffinity(0, ALLOWED)


@linux_only
def test_a_thread_that_ended_is_skipped(sleepers):
    gone = threading.Thread(target=lambda: None)
    gone.start()
    gone.join()
    gone_tid = gone.native_id
    follower = ModelCpuFollower([gone, *sleepers])
    assert follower.active and gone_tid is not None
    follower._cpu = -1  # make the next hand-over move them again
    follower.hand_over()
    assert follower.active
    assert os.sched_getaffinity(sleepers[0].native_id) == os.sched_getaffinity(
        sleepers[1].native_id)
    assert len(os.sched_getaffinity(sleepers[0].native_id)) == 1


class _Sender:
    """A real thread playing the output thread: sends (records) each queued frame, then
    acknowledges it, unless ``hold`` is set."""

    def __init__(self) -> None:
        self.frames: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.sent: list[int] = []
        self.hold = threading.Event()
        self.go = threading.Event()
        self.follower: ModelCpuFollower | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while (frame := self.frames.get()) is not None:
            if self.hold.is_set():
                self.go.wait()
            self.sent.append(frame)
            assert self.follower is not None
            self.follower.sent()

    def queue(self, frame: int) -> None:
        """What the loop does for each frame (``EngineProc._send``)."""
        assert self.follower is not None
        self.follower.expect()
        self.frames.put(frame)
        self.follower.hand_over()

    def stop(self) -> None:
        self.go.set()
        self.frames.put(None)
        self.thread.join(timeout=10)


@linux_only
def test_hand_over_returns_once_the_frame_is_sent(monkeypatch):
    monkeypatch.setattr(io_threads, "HAND_OVER_WAIT", 30.0)  # a loaded box never times out
    sender = _Sender()
    try:
        sender.follower = ModelCpuFollower([sender.thread])
        for i in range(50):
            sender.queue(i)
            assert sender.sent == list(range(i + 1))  # sent before the loop goes on
    finally:
        sender.stop()


@linux_only
def test_an_output_thread_stuck_behind_a_slow_reader_never_slows_the_loop(monkeypatch):
    monkeypatch.setattr(io_threads, "HAND_OVER_WAIT", 0.5)
    sender = _Sender()
    try:
        sender.follower = ModelCpuFollower([sender.thread])
        sender.queue(0)
        sender.hold.set()  # the next send blocks, as on a full channel
        start = time.monotonic()
        for i in range(1, 41):
            sender.queue(i)
        # One timed-out wait, then none: 40 waits would take 20 s.
        assert time.monotonic() - start < 5.0
        sender.go.set()  # the reader drains: everything goes out, in order
        deadline = time.monotonic() + 10
        while len(sender.sent) < 41 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sender.sent == list(range(41))
        monkeypatch.setattr(io_threads, "HAND_OVER_WAIT", 30.0)
        sender.hold.clear()
        for i in range(41, 51):  # caught up: the loop waits for each frame again
            sender.queue(i)
            assert sender.sent == list(range(i + 1))
    finally:
        sender.stop()


def _io_threads(pid: int) -> dict[int, set[int]]:
    """The engine's I/O threads (the batch ones) and the CPUs each may run on."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return {t: os.sched_getaffinity(t) for t in tids
            if os.sched_getscheduler(t) == os.SCHED_BATCH}


def _stream(engine: EngineHarness, rid: str, tokens: int) -> int:
    """Generate ``tokens`` greedily for one request; how many frames carried its tokens."""
    engine.send(AddRequest(rid, [5, 6, 7], SamplingParams(max_tokens=tokens, ignore_eos=True,
                                                         temperature=0.0), time.time()))
    frames = got = 0
    while got < tokens:
        msg = engine.recv()
        if isinstance(msg, StepOutputs):
            mine = [d for d in msg.outputs if d.request_id == rid]
            frames += bool(mine)
            got += sum(len(d.new_token_ids) for d in mine)
    return frames


@linux_only
@two_cpus
def test_uniproc_engine_keeps_io_threads_on_one_cpu_and_sends_every_step(one_thread):
    engine = EngineHarness(small_config(), transport="shm")
    try:
        engine.call("ping")
        frames = _stream(engine, "r", 64)
        pid = engine.pid
        io = _io_threads(pid)
        assert len(io) == 2, io
        cpus = list(io.values())
        assert len(cpus[0]) == 1 and cpus[0] == cpus[1], io
        assert os.sched_getaffinity(pid) == ALLOWED  # the loop (main thread) is never pinned
        # The hand-over gives the output thread the CPU after every step: without it a batch
        # thread sharing the model's CPU waits for a scheduler tick and ~2 tokens go per frame.
        assert frames >= 0.75 * 64, frames
    finally:
        engine.close()


@linux_only
@pytest.mark.parametrize("changes", [dict(colocate_io_threads=False), dict(executor="mp")],
                         ids=["option-off", "mp"])
def test_io_threads_run_anywhere_when_the_model_is_not_computing_here(one_thread, changes):
    engine = EngineHarness(small_config(**changes), transport="shm")
    try:
        _stream(engine, "r", 8)
        io = _io_threads(engine.pid)
        assert len(io) == 2 and all(cpus == ALLOWED for cpus in io.values()), io
    finally:
        engine.close()
