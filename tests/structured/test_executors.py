"""Constrained decoding on the mp executor (worker processes, one rank) and with tensor
parallelism (two ranks): the bitmask travels with each step to every rank, and the outputs are
the uniproc executor's, token for token, and valid."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest
from tokenizers import Tokenizer

from aioengine.hub import resolve_model
from aioengine.messages import AddRequest, SamplingParams, StructuredOutputs
from tests.engine.conftest import one_thread, small_config  # noqa: F401 (a fixture)
from tests.engine.workload import run_core

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "ok": {"type": "boolean"},
    "tag": {"enum": ["x", "y", "z"]}},
    "required": ["id", "ok", "tag"], "additionalProperties": False}

SPECS = {
    "json": (StructuredOutputs(json=SCHEMA),
             lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    "regex": (StructuredOutputs(regex=r"[a-f]{2}[0-9]{2}"),
              lambda t: re.fullmatch(r"[a-f]{2}[0-9]{2}", t)),
    "choice": (StructuredOutputs(choice=["north", "south"]), lambda t: t in ("north", "south")),
}


def requests() -> list[AddRequest]:
    out = []
    for i in range(3):
        for name, (spec, _) in SPECS.items():
            params = SamplingParams(max_tokens=60, temperature=1.0, seed=40 + i, logprobs=1,
                                    structured_outputs=spec)
            out.append(AddRequest(f"{name}{i}", [5, 6, 7, 8 + i], params, time.time()))
        out.append(AddRequest(f"plain{i}", [5, 6, 9 + i],
                              SamplingParams(max_tokens=6, temperature=1.0, seed=i), time.time()))
    return out


def run(**changes) -> dict:
    from aioengine.engine.core import EngineCore

    core = EngineCore(small_config(**changes))
    try:
        return run_core(core, requests())
    finally:
        core.shutdown()


@pytest.fixture(scope="module")
def reference(one_thread):  # noqa: F811
    return run(executor="uniproc")


def check(got: dict, reference: dict) -> None:
    tok = Tokenizer.from_file(resolve_model("tiny").tokenizer_path + "/tokenizer.json")
    for rid, ref in reference.items():
        assert got[rid].tokens == ref.tokens, rid
        name = rid.rstrip("0123456789")
        if name in SPECS:
            assert got[rid].finish_reason == "stop", (rid, got[rid])
            text = tok.decode(got[rid].tokens, skip_special_tokens=True)
            assert SPECS[name][1](text), (rid, text)


def test_mp_executor_one_rank_matches_uniproc(reference):
    check(run(executor="mp"), reference)


@pytest.mark.slow
def test_tensor_parallel_2_matches_uniproc(reference):
    check(run(executor="mp", tensor_parallel_size=2), reference)
