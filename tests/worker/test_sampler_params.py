"""Every invalid SamplingParams field raises a ValueError that names it (direct and decoded)."""

from __future__ import annotations

import msgspec
import pytest

from aioengine.messages.sampling_params import SamplingParams

INVALID = [
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 1.5), ("max_tokens", True),
    ("max_tokens", 2**63), ("top_k", 2**63), ("stop_token_ids", [2**63]),  # past int64
    ("temperature", -0.1), ("temperature", 101.0), ("temperature", float("nan")),
    ("temperature", float("inf")), ("temperature", "hot"),
    ("top_p", 0.0), ("top_p", 1.01), ("top_p", -1.0), ("top_p", float("nan")),
    ("top_k", 0), ("top_k", -2), ("top_k", 2.0), ("top_k", False),
    ("min_p", -0.01), ("min_p", 1.5), ("min_p", None),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", 101.0),
    ("presence_penalty", -2.5), ("presence_penalty", 2.5),
    ("frequency_penalty", -2.01), ("frequency_penalty", 3.0),
    ("seed", -1), ("seed", 2**63), ("seed", 1.0), ("seed", True),
    ("stop", [""]), ("stop", [1]), ("stop", 5), ("stop", None),
    ("stop_token_ids", [-1]), ("stop_token_ids", ["a"]), ("stop_token_ids", [True]),
    ("stop_token_ids", 3), ("stop_token_ids", None),
    ("min_tokens", -1), ("min_tokens", 17),  # above the default max_tokens (16)
    ("logprobs", -1), ("logprobs", 21), ("logprobs", True), ("logprobs", 1.0),
    ("ignore_eos", 1), ("ignore_eos", "yes"), ("include_stop_str_in_output", None),
    ("skip_special_tokens", 0),
]


@pytest.mark.parametrize("field,value", INVALID)
def test_invalid_field_raises_naming_it(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field,value", [
    (f, v) for f, v in INVALID
    if isinstance(v, (int, str, list)) and not isinstance(v, bool)])
def test_decoding_an_invalid_field_fails_cleanly(field: str, value: object) -> None:
    frame = msgspec.msgpack.encode({field: value})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(frame, type=SamplingParams)


def test_valid_edges_accepted() -> None:
    p = SamplingParams(max_tokens=5, min_tokens=5, temperature=0.0, top_p=1.0, top_k=1,
                       min_p=1.0, repetition_penalty=100.0, presence_penalty=-2.0,
                       frequency_penalty=2.0, seed=2**63 - 1, stop="x",
                       stop_token_ids=[0, 2**63 - 1],
                       logprobs=20, ignore_eos=True)
    assert p.stop == ["x"] and p.greedy
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p
