"""The engine's output thread merges the StepOutputs that piled up behind it into one frame,
keeping every other message (utility results, failure, the shutdown sentinel) in its place."""

import queue

import msgspec

from aioengine.engine.core_proc import _merge_pending
from aioengine.messages.engine_io import EngineFailure, RequestDelta, StepOutputs, UtilityResult


def _step(rid: str, token: int, t: float) -> StepOutputs:
    return StepOutputs([RequestDelta(rid, [token])], t)


def _frame(msg):
    """What the busy loop queues: the message and its encoding (None stays the sentinel)."""
    return None if msg is None else (msg, msgspec.msgpack.encode(msg))


def test_nothing_pending_sends_the_message_as_is():
    q: queue.SimpleQueue = queue.SimpleQueue()
    first = _step("a", 1, 1.0)
    held: list = []
    assert _merge_pending(first, q, held) is first and held == []


def test_steps_behind_merge_in_order_with_the_latest_timestamp():
    q: queue.SimpleQueue = queue.SimpleQueue()
    for msg in (_step("a", 2, 2.0), StepOutputs([RequestDelta("b", [7]),
                                                 RequestDelta("a", [3])], 3.0)):
        q.put(_frame(msg))
    held: list = []
    merged = _merge_pending(_step("a", 1, 1.0), q, held)
    assert [(d.request_id, d.new_token_ids) for d in merged.outputs] == [
        ("a", [1]), ("a", [2]), ("b", [7]), ("a", [3])]
    assert merged.timestamp == 3.0 and held == [] and q.empty()


def test_a_message_of_another_kind_ends_the_merge_and_keeps_its_place():
    q: queue.SimpleQueue = queue.SimpleQueue()
    result, failure = UtilityResult(5, "pong"), EngineFailure("boom")
    for msg in (_step("a", 2, 2.0), result, _step("a", 3, 3.0), failure, None):
        q.put(_frame(msg))
    held: list = []
    merged = _merge_pending(_step("a", 1, 1.0), q, held)
    assert [d.new_token_ids for d in merged.outputs] == [[1], [2]]
    assert held == [_frame(result)]
    # What stays queued comes after the held message, in the order it was queued.
    assert [q.get_nowait() for _ in range(3)][1:] == [_frame(failure), None]


def test_the_shutdown_sentinel_is_held_not_dropped():
    q: queue.SimpleQueue = queue.SimpleQueue()
    q.put(_frame(_step("a", 2, 2.0)))
    q.put(None)
    held: list = []
    merged = _merge_pending(_step("a", 1, 1.0), q, held)
    assert len(merged.outputs) == 2 and held == [None]
