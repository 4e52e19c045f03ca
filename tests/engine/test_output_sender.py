"""OutputSender over every real transport: inline while there is room, a background thread
when the channel is full, frames always in order, a closed client reported once."""

from __future__ import annotations

import threading

import msgspec
import pytest

from aioengine.engine.output_sender import CLOSED_BY_CLIENT, OutputSender
from aioengine.messages.engine_io import EngineMessage, RequestDelta, StepOutputs
from transports import open_reader, open_writer

TRANSPORTS = ["shm", "uds", "zmq"]
CAPACITY = 64 * 1024


def step(i: int, tokens: int = 1) -> StepOutputs:
    return StepOutputs([RequestDelta(f"r{i}", list(range(tokens)))], float(i))


@pytest.fixture(params=TRANSPORTS)
def channel(request):
    writer = open_writer(request.param, bind=True, capacity=CAPACITY)
    reader = open_reader(writer.address, bind=False, capacity=CAPACITY)
    yield writer, reader
    reader.close()
    writer.close()


class Failures:
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.event.set()


def received(reader, n: int) -> list[EngineMessage]:
    decoder = msgspec.msgpack.Decoder(EngineMessage)
    return [decoder.decode(reader.recv(timeout=30).header) for _ in range(n)]


def test_inline_send_when_there_is_room(channel):
    writer, reader = channel
    failures = Failures()
    sender = OutputSender(writer, failures)
    try:
        sender.send(step(1))
        assert sender.backlog == 0  # went out on this thread, not through the backlog
        assert received(reader, 1) == [step(1)]
    finally:
        sender.close()
    assert failures.reasons == []


def test_full_channel_goes_through_the_thread_in_order(channel):
    writer, reader = channel
    failures = Failures()
    sender = OutputSender(writer, failures)
    n, peak = 600, 0
    try:
        # Nobody reads yet: ~8 KiB frames fill any of the channels (and their kernel buffers),
        # and send must still return every time.
        for i in range(n):
            sender.send(step(i, tokens=2000))
            peak = max(peak, sender.backlog)
        assert peak > 0, "the channel never filled: the backlog path was not exercised"
        got = received(reader, n)
    finally:
        sender.close()
    assert [m.outputs[0].request_id for m in got] == [f"r{i}" for i in range(n)]
    assert got[-1] == step(n - 1, tokens=2000)
    assert sender.backlog == 0
    assert failures.reasons == []


def test_closed_client_is_reported_once_and_later_frames_dropped(channel):
    writer, reader = channel
    failures = Failures()
    sender = OutputSender(writer, failures)
    reader.close()
    try:
        for i in range(2000):  # a closed peer is noticed on a send (possibly after a few)
            sender.send(step(i, tokens=100))
            if failures.event.wait(0.001):
                break
        assert failures.event.wait(10), "the closed client was never reported"
        sender.send(step(-1))  # dropped, no exception
    finally:
        sender.close()
    assert failures.reasons == [CLOSED_BY_CLIENT]


def test_close_is_idempotent_and_later_sends_are_dropped(channel):
    writer, reader = channel
    sender = OutputSender(writer, Failures())
    sender.close()
    sender.close()
    sender.send(step(1))
    with pytest.raises(TimeoutError):
        reader.recv(timeout=0.2)
