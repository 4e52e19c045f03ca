"""Lifecycle events: plain msgpack on a real one-way Pipe, and clear errors for bad frames."""

from __future__ import annotations

import multiprocessing

import msgpack
import msgspec
import pytest

from aioengine.runtime.events import (
    Event,
    EventDecodeError,
    EventSender,
    EventType,
    decode_event,
    encode_event,
)


@pytest.fixture
def pipe():
    reader, writer = multiprocessing.get_context("spawn").Pipe(duplex=False)
    yield reader, writer
    reader.close()
    writer.close()


def test_events_are_plain_msgpack_maps(pipe):
    reader, writer = pipe
    sender = EventSender(writer, "aioengine-test")
    sender.send(EventType.STARTUP)
    sender.send_ready({"address": "shm://x", "capacity": 7})
    try:
        raise RuntimeError("bad thing")
    except RuntimeError as exc:
        sender.send_error(exc)
    sender.send(EventType.DEAD, exit_code=1)
    frames = [reader.recv_bytes() for _ in range(4)]
    plain = [msgpack.unpackb(f) for f in frames]
    assert [p["type"] for p in plain] == ["STARTUP", "READY", "ERROR", "DEAD"]
    assert plain[1]["payload"] == {"address": "shm://x", "capacity": 7}
    assert plain[2]["exc_type"] == "RuntimeError" and plain[2]["message"] == "bad thing"
    tb = plain[2]["traceback"]
    assert "test_events.py" in tb and "raise RuntimeError" in tb
    assert plain[3]["exit_code"] == 1
    assert decode_event(frames[1]).type is EventType.READY


def test_sender_survives_a_closed_pipe(pipe):
    reader, writer = pipe
    reader.close()
    sender = EventSender(writer, "aioengine-test")
    sender.send(EventType.SHUTDOWN)  # EPIPE: dropped, never raised (cleanup must still run)
    sender.send(EventType.DEAD, exit_code=0)


@pytest.mark.parametrize("payload, needle", [
    ([1, 2], "must return a dict"),
    ({"obj": object()}, "not msgpack-encodable"),
    ({1: "x"}, "keys must be str"),
])
def test_bad_ready_payload_is_a_clear_type_error(pipe, payload, needle):
    sender = EventSender(pipe[1], "aioengine-test")
    with pytest.raises(TypeError, match=needle):
        sender.send_ready(payload)


@pytest.mark.parametrize("frame, needle", [
    (b"\xc1", "malformed"),
    (msgspec.msgpack.encode({"type": "NOPE", "name": "x", "pid": 1, "time": 0.0}), "NOPE"),
    (msgspec.msgpack.encode({"type": "READY", "name": "x"}), "pid"),
    (msgspec.msgpack.encode({"type": "READY", "name": "x", "pid": 1, "time": 0.0, "zz": 1}),
     "zz"),
])
def test_malformed_frames_raise_event_decode_error(frame, needle):
    with pytest.raises(EventDecodeError, match=needle):
        decode_event(frame)


def test_round_trip():
    event = Event(type=EventType.ERROR, name="n", pid=3, time=1.5, exc_type="E", message="m",
                  traceback="tb")
    assert decode_event(encode_event(event)) == event
