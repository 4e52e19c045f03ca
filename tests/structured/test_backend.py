"""The llguidance backend on the tiny model's tokenizer: compile, masks, errors."""

import json

import numpy as np
import pytest

from aioengine.hub import read_model_info, resolve_model
from aioengine.messages import StructuredOutputs
from aioengine.structured import GrammarBackend, GrammarError, check_spec, spec_key


@pytest.fixture(scope="module")
def backend():
    resolved = resolve_model("tiny")
    info = read_model_info(resolved.model_path, resolved.tokenizer_path)
    return GrammarBackend(resolved.tokenizer_path, info.vocab_size, info.eos_token_ids)


def allowed(backend, matcher) -> set[int]:
    out = np.zeros((1, backend.words), dtype=np.int32)
    backend.fill_bitmask([matcher], out)
    bits = np.unpackbits(out.view(np.uint8), bitorder="little")[:backend.vocab_size]
    return set(np.flatnonzero(bits).tolist())


def test_choice_mask_allows_only_prefixes_of_the_choices(backend):
    m = backend.matcher(backend.compile(StructuredOutputs(choice=["yes", "no"])))
    tok = backend.tokenizer
    ok = allowed(backend, m)
    assert ok
    for t in ok:
        text = tok.decode_str([t])
        assert "yes".startswith(text) or "no".startswith(text), text
    # Walk to "no" and the end: only eos remains, then the matcher is terminated.
    for t in tok.tokenize_str("no"):
        assert m.accept(t)
    assert allowed(backend, m) <= set(read_model_info(resolve_model("tiny").model_path)
                                      .eos_token_ids)
    assert m.accept(next(iter(allowed(backend, m))))
    assert m.is_terminated


def test_a_refused_token_is_reported_and_rollback_undoes_a_token(backend):
    m = backend.matcher(backend.compile(StructuredOutputs(regex="[0-9]+")))
    digit = backend.tokenizer.tokenize_str("7")[-1]
    assert m.accept(digit)
    m.rollback(1)
    assert allowed(backend, m) == allowed(backend, backend.matcher(
        backend.compile(StructuredOutputs(regex="[0-9]+"))))
    letter = backend.tokenizer.tokenize_str("x")[-1]
    assert not m.accept(letter)
    assert m.error


def test_batched_masks_equal_one_by_one(backend):
    specs = [StructuredOutputs(json={"type": "object"}), StructuredOutputs(regex="a+b"),
             StructuredOutputs(choice=["red", "green"])]
    matchers = [backend.matcher(backend.compile(s)) for s in specs]
    out = np.zeros((3, backend.words), dtype=np.int32)
    backend.fill_bitmask(matchers, out)
    for i, m in enumerate(matchers):
        one = np.zeros((1, backend.words), dtype=np.int32)
        backend.fill_bitmask([m], one)
        assert (out[i] == one[0]).all()


@pytest.mark.parametrize("spec, match", [
    (StructuredOutputs(regex="(ab"), "unclosed group"),
    (StructuredOutputs(json={"type": "nonsense"}), "nonsense"),
    (StructuredOutputs(json="{not json"), "not valid JSON"),
    (StructuredOutputs(grammar="root ::= ("), "GBNF"),
    (StructuredOutputs(grammar="start: undefined_rule"), "undefined_rule"),
])
def test_invalid_constraints_name_the_cause(backend, spec, match):
    with pytest.raises(GrammarError, match=match):
        check_spec(spec)
    with pytest.raises(GrammarError, match=match):
        backend.compile(spec)


def test_gbnf_and_lark_both_compile(backend):
    check_spec(StructuredOutputs(grammar='root ::= "a" [0-9]+'))
    check_spec(StructuredOutputs(grammar='start: "a" /[0-9]+/'))


def test_spec_key_is_the_same_for_equal_schemas():
    a = StructuredOutputs(json={"type": "object", "properties": {"x": {"type": "integer"}}})
    b = StructuredOutputs(json=json.dumps({"properties": {"x": {"type": "integer"}},
                                           "type": "object"}))
    assert spec_key(a) == spec_key(b)
    assert spec_key(a) != spec_key(StructuredOutputs(json_object=True))


@pytest.mark.parametrize("kwargs, match", [
    ({}, "exactly one"),
    ({"regex": "a", "choice": ["a"]}, "exactly one"),
    ({"choice": []}, "non-empty list"),
    ({"regex": ""}, "non-empty string"),
    ({"json_object": "yes"}, "must be a bool"),
    ({"json": 5}, "JSON schema"),
])
def test_structured_outputs_validates_its_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StructuredOutputs(**kwargs)
