"""Structured outputs in the engine (uniproc, in process) on the tiny model: every constrained
output parses and validates, under batching, preemption, seeds, logprobs and bad grammars."""

import itertools
import json
import re
import time

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from aioengine.hub import resolve_model
from aioengine.messages import AddRequest, SamplingParams, StructuredOutputs

from ..structured.schemas import schemas
from .conftest import small_config
from .workload import Output, run_core


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(resolve_model("tiny").tokenizer_path + "/tokenizer.json")


def text_of(tokenizer, out: Output) -> str:
    return tokenizer.decode(out.tokens, skip_special_tokens=True)


def constrained(spec: StructuredOutputs, **kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 80, "temperature": 1.0, **kw},
                          structured_outputs=spec)


def req(rid: str, params: SamplingParams, prompt=(5, 6, 7, 8)) -> AddRequest:
    return AddRequest(rid, list(prompt), params, time.time())


_ids = itertools.count()


# Found with seed 252183406114408104821495817939129454038: not a hang in the engine but a
# correct "length" finish (a deep schema needs more tokens than the 96-token context) that the
# test called a failure; hypothesis then shrank it, one engine run per step, for over 300 s. A
# cut output must be a prefix the grammar allows and must have used the whole budget; the
# examples are few, the shrink phase is off (a failure reports its example at once) and the
# test has its own timeout.
@pytest.mark.timeout(240)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.generate])
@given(st.lists(schemas, min_size=6, max_size=6), st.integers(0, 2**31))
def test_every_output_validates_against_its_random_schema(core, tokenizer, batch, seed):
    prompt = (5, 6, 7, 8)
    requests = [req(f"s{next(_ids)}", constrained(StructuredOutputs(json=s), seed=seed + i,
                                                max_tokens=200), prompt=prompt)
                for i, s in enumerate(batch)]
    outs = run_core(core, requests)
    budget = min(200, core.max_model_len - len(prompt))
    for schema, r in zip(batch, requests, strict=True):
        out = outs[r.request_id]
        assert out.finish_reason in ("stop", "length"), (schema, out)
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(text_of(tokenizer, out)), schema)
            continue
        assert len(out.tokens) == budget, (schema, out)
        backend = core.grammars.backend
        matcher = backend.matcher(backend.compile(r.params.structured_outputs))
        assert all(matcher.accept(t) for t in out.tokens), (schema, out)
        assert not matcher.is_terminated


def test_choice_regex_grammar_and_json_object(core, tokenizer):
    specs = {
        "choice": (StructuredOutputs(choice=["red", "green", "blue"]),
                   lambda t: t in ("red", "green", "blue")),
        "regex": (StructuredOutputs(regex=r"[a-z]{3}-[0-9]{2}"),
                  lambda t: re.fullmatch(r"[a-z]{3}-[0-9]{2}", t)),
        "gbnf": (StructuredOutputs(grammar='root ::= "yes" | "no" | "maybe"'),
                 lambda t: t in ("yes", "no", "maybe")),
        "lark": (StructuredOutputs(grammar='start: "(" /[0-9]{1,3}/ ")"'),
                 lambda t: re.fullmatch(r"\([0-9]{1,3}\)", t)),
    }
    requests = [req(f"{name}{i}", constrained(spec, seed=i))
                for name, (spec, _) in specs.items() for i in range(4)]
    # Greedy too: the argmax must come from the allowed tokens.
    requests += [req(f"{name}-greedy", constrained(spec, temperature=0.0))
                 for name, (spec, _) in specs.items()]
    outs = run_core(core, requests)
    for r in requests:
        name = r.request_id.split("-")[0].rstrip("0123456789")
        text = text_of(tokenizer, outs[r.request_id])
        assert outs[r.request_id].finish_reason == "stop", (r.request_id, text)
        assert specs[name][1](text), (r.request_id, text)


def test_json_object_gives_an_object_or_runs_out_of_tokens(core, tokenizer):
    """Any object may be unbounded (free strings): a finished one parses, a cut one is a
    prefix of an object."""
    requests = [req(f"obj{i}", constrained(StructuredOutputs(json_object=True), seed=i,
                                           max_tokens=40)) for i in range(6)]
    outs = run_core(core, requests)
    for r in requests:
        out = outs[r.request_id]
        text = text_of(tokenizer, out)
        assert text.startswith("{")
        if out.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert out.finish_reason == "length"


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


def test_invalid_grammar_fails_only_its_request(core, tokenizer):
    requests = [req("bad-regex", constrained(StructuredOutputs(regex="(ab"))),
                req("bad-schema", constrained(StructuredOutputs(json={"type": "what"}))),
                req("good", constrained(StructuredOutputs(json=SCHEMA), seed=1)),
                req("plain", SamplingParams(max_tokens=5, temperature=0.0))]
    outs = run_core(core, requests)
    assert outs["bad-regex"].finish_reason == "error"
    assert "unclosed group" in outs["bad-regex"].error
    assert outs["bad-schema"].finish_reason == "error"
    assert "what" in outs["bad-schema"].error
    jsonschema.validate(json.loads(text_of(tokenizer, outs["good"])), SCHEMA)
    assert len(outs["plain"].tokens) == 5
    # The same bad schema again is answered from the cache, and the engine still serves.
    compiles = core.grammars.compiles
    outs = run_core(core, [req("bad-again", constrained(StructuredOutputs(regex="(ab"))),
                           req("good-again", constrained(StructuredOutputs(json=SCHEMA)))])
    assert outs["bad-again"].finish_reason == "error"
    assert outs["good-again"].finish_reason == "stop"
    assert core.grammars.compiles == compiles


def test_seeded_outputs_survive_preemption_and_match_alone_runs(one_thread, tokenizer):
    """Twelve constrained requests on a KV cache too small for them: preemption by recompute
    must not change a seeded request's tokens, nor break its grammar; with logprobs and a
    prefix shared (prefix-cache hits)."""
    from aioengine.engine.core import EngineCore

    shared = list(range(10, 30))
    requests = [req(f"p{i}", constrained(StructuredOutputs(json=SCHEMA), seed=100 + i,
                                         logprobs=2),
                    prompt=[*shared, 40 + i]) for i in range(12)]
    alone = EngineCore(small_config(max_num_seqs=1))
    try:
        reference = {r.request_id: run_core(alone, [r])[r.request_id] for r in requests}
    finally:
        alone.shutdown()
    busy = EngineCore(small_config(num_kv_blocks=24))
    try:
        outs = run_core(busy, requests)
        assert busy.scheduler.num_preempted_total > 0
    finally:
        busy.shutdown()
    for r in requests:
        out = outs[r.request_id]
        assert out.tokens == reference[r.request_id].tokens, r.request_id
        assert len(out.logprobs) == len(out.tokens)
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(text_of(tokenizer, out)), SCHEMA)


def test_abort_while_compiling_and_mixed_batch(core):
    spec = StructuredOutputs(json={"type": "object", "properties": {
        f"f{i}": {"type": "integer", "minimum": 0, "maximum": 9} for i in range(40)},
        "required": [f"f{i}" for i in range(40)]})
    core.add_request(req("to-abort", constrained(spec)))
    core.abort(["to-abort"])
    deltas = core.step()
    assert [(d.request_id, d.finish_reason) for d in deltas] == [("to-abort", "abort")]
    outs = run_core(core, [req("after", SamplingParams(max_tokens=3, temperature=0.0))])
    assert len(outs["after"].tokens) == 3
    assert not core.has_work()


def test_logit_bias_bans_and_forces_tokens(core):
    plain = run_core(core, [req("lb0", SamplingParams(max_tokens=4, temperature=0.0))])["lb0"]
    banned = plain.tokens[0]
    outs = run_core(core, [
        req("lb1", SamplingParams(max_tokens=4, temperature=0.0, logit_bias={banned: -100})),
        req("lb2", SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True,
                                  logit_bias={77: 100.0}))])
    assert outs["lb1"].tokens[0] != banned
    assert outs["lb2"].tokens == [77] * 4


def test_logit_bias_is_validated():
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1: 200.0})
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={-1: 1.0})
