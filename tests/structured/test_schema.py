"""Object schemas are closed to their declared properties unless they say otherwise: the
transform itself, and what the compiled grammar then admits (the tiny model's tokenizer)."""

from __future__ import annotations

import copy
import json

import pytest

from aioengine.hub import read_model_info, resolve_model
from aioengine.messages import StructuredOutputs
from aioengine.structured import GrammarBackend, closed_objects


def test_objects_that_list_properties_are_closed_at_every_depth() -> None:
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "string"}}},
        "b": {"type": "array", "items": {"properties": {"y": {}}}},
        "c": {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}},
        "d": {"anyOf": [{"properties": {"p": {}}}, {"type": "null"}]},
        "e": {"$ref": "#/$defs/E"},
        "f": {"type": "array", "prefixItems": [{"properties": {"t": {}}}]},
        "g": {"oneOf": [{"properties": {"o": {}}}, {"type": "string"}]},
        "h": {"type": "object"},  # lists nothing: any object, as json_object
        "i": {"type": "object", "additionalProperties": {"properties": {"v": {}}}}},
        "$defs": {"E": {"properties": {"z": {}}}},
        "definitions": {"F": {"properties": {"w": {}}}}}
    before = copy.deepcopy(schema)
    closed = closed_objects(schema)
    assert schema == before  # the caller's schema is not changed
    props = closed["properties"]
    assert closed["additionalProperties"] is False
    assert props["a"]["additionalProperties"] is False
    assert props["b"]["items"]["additionalProperties"] is False
    assert props["c"]["additionalProperties"] == {"type": "integer"}  # said: kept
    assert props["d"]["anyOf"][0]["additionalProperties"] is False
    assert props["d"]["anyOf"][1] == {"type": "null"}
    assert props["e"] == {"$ref": "#/$defs/E"}
    assert closed["$defs"]["E"]["additionalProperties"] is False
    assert closed["definitions"]["F"]["additionalProperties"] is False
    assert props["f"]["prefixItems"][0]["additionalProperties"] is False
    assert props["g"]["oneOf"][0]["additionalProperties"] is False
    assert props["h"] == {"type": "object"}
    assert props["i"]["additionalProperties"]["additionalProperties"] is False
    assert closed_objects(closed) == closed  # idempotent


def test_a_schema_that_opts_in_keeps_its_other_keys() -> None:
    for other in (True, {"type": "integer"}):
        schema = {"type": "object", "properties": {"a": {}}, "additionalProperties": other}
        assert closed_objects(schema)["additionalProperties"] == other
    patterned = {"properties": {"a": {}}, "patternProperties": {"^x_": {}}}
    assert "additionalProperties" not in closed_objects(patterned)
    unevaluated = {"properties": {"a": {}}, "unevaluatedProperties": {"type": "string"}}
    assert "additionalProperties" not in closed_objects(unevaluated)


def test_parts_of_an_allof_are_not_closed_alone() -> None:
    plain = {"allOf": [{"type": "object", "properties": {"p": {"type": "integer"}}},
                       {"properties": {"q": {"properties": {"n": {}}}}, "required": ["q"]}]}
    closed = closed_objects(plain)
    # Each part alone would reject the other's key; the whole is closed over both names.
    assert all("additionalProperties" not in m for m in closed["allOf"])
    assert closed["properties"] == {"p": {}, "q": {}}
    assert closed["additionalProperties"] is False
    assert closed["allOf"][1]["properties"]["q"]["additionalProperties"] is False  # a value

    # Alternatives beside the object's own properties are parts of it too.
    tagged = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}},
              "required": ["kind"],
              "oneOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
    closed = closed_objects(tagged)
    assert all("additionalProperties" not in m for m in closed["oneOf"])
    assert list(closed["properties"]) == ["kind", "a", "b"]
    assert closed["properties"]["kind"] == {"enum": ["a", "b"]}
    assert closed["additionalProperties"] is False

    # A part by $ref (hand-written inheritance) and alternatives inside a part: left open.
    inherited = {"$defs": {"Base": {"properties": {"id": {}}},
                           "Other": {"properties": {"o": {}}}},
                 "allOf": [{"$ref": "#/$defs/Base"},
                           {"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}],
                 "properties": {"other": {"$ref": "#/$defs/Other"}}}
    closed = closed_objects(inherited)
    assert "additionalProperties" not in closed["$defs"]["Base"]
    assert all("additionalProperties" not in m for m in closed["allOf"][1]["anyOf"])
    assert "additionalProperties" not in closed
    assert closed["$defs"]["Other"]["additionalProperties"] is False  # not a part: closed


@pytest.fixture(scope="module")
def backend() -> GrammarBackend:
    resolved = resolve_model("tiny")
    info = read_model_info(resolved.model_path, resolved.tokenizer_path)
    return GrammarBackend(resolved.tokenizer_path, info.vocab_size, info.eos_token_ids)


def admits(backend: GrammarBackend, schema: dict, value: object) -> bool:
    """Whether the grammar of ``schema`` accepts ``value`` written as the engine writes JSON
    and then lets it end."""
    m = backend.matcher(backend.compile(StructuredOutputs(json=schema)))
    ids = backend.tokenizer.tokenize_str(json.dumps(value))
    return all(m.accept(t) for t in ids) and m._m.is_accepting()


PERSON = {"type": "object", "properties": {
    "name": {"type": "string"},
    "pet": {"type": "object", "properties": {"kind": {"type": "string"}}}},
    "required": ["name"]}


def test_the_grammar_admits_only_declared_keys_unless_the_schema_opts_in(backend) -> None:
    assert admits(backend, PERSON, {"name": "a", "pet": {"kind": "cat"}})
    assert not admits(backend, PERSON, {"name": "a", "extra": 1})
    assert not admits(backend, PERSON, {"name": "a", "pet": {"kind": "cat", "extra": 1}})
    opted_in = {**PERSON, "additionalProperties": True}
    assert admits(backend, opted_in, {"name": "a", "extra": 1})
    assert not admits(backend, opted_in, {"name": "a", "pet": {"kind": "cat", "extra": 1}})
    split = {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                       {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
    assert admits(backend, split, {"a": 1, "b": 2})
    assert not admits(backend, split, {"a": 1, "b": 2, "c": 3})
    assert not admits(backend, split, {"a": "x", "b": 2})  # the parts still say what a is
    tagged = {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"],
              "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
    assert admits(backend, tagged, {"kind": "x", "a": 1})
    assert admits(backend, tagged, {"kind": "x", "b": 1})
    assert not admits(backend, tagged, {"kind": "x", "a": 1, "c": 3})
    # json_object is any object: nothing to close.
    m = backend.matcher(backend.compile(StructuredOutputs(json_object=True)))
    assert all(m.accept(t) for t in backend.tokenizer.tokenize_str('{"any": 1}'))
