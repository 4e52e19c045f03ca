"""JSON schemas as the grammar reads them: objects closed to their declared properties.

JSON Schema lets an object hold keys it does not list unless it says ``additionalProperties:
false``; pydantic and most hand-written schemas say nothing. Under a grammar a weak model then
invents keys of its own, often until ``max_tokens``, and the output is not JSON. OpenAI's
strict mode and xgrammar read such an object as closed; so do we, for ``response_format``,
``structured_outputs.json`` and tool parameters alike. A schema that wants other keys says so
(``additionalProperties: true`` or a schema for them), and that is kept.
"""

from __future__ import annotations

from typing import Any

# Keys whose value is a map of names to schemas, and keys whose value is a schema or a list of
# them: both are walked. ``not``, ``if``/``then``/``else``, ``contains`` and
# ``dependentSchemas`` are not: closing an object inside them would change what they admit
# in ways the writer did not ask for (inside ``not`` it even widens).
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_VALUES = ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf")
# An object with any of these says something of its other keys, or gets properties from
# elsewhere (a sibling ``$ref``, a conditional): closing it could reject what they allow.
_OPEN_BY = ("additionalProperties", "patternProperties", "unevaluatedProperties", "$ref",
            "if", "then", "else", "dependentSchemas")
# What an ``allOf`` member may hold for its property names to be merged into its parent.
_PLAIN_MEMBER_KEYS = frozenset(("type", "properties", "required", "title", "description"))


def closed_objects(schema: Any) -> Any:
    """A copy of ``schema`` in which every object schema that lists ``properties`` and says
    nothing of other keys has ``additionalProperties: false``, at any depth (``properties``,
    ``$defs``/``definitions``, ``items``, ``prefixItems``, ``anyOf``, ``oneOf``, ``allOf``).

    A part of an ``allOf`` is never closed itself (it would reject the other parts' keys):
    neither a member, nor the alternatives of its ``anyOf``/``oneOf``, nor a definition it
    points to with ``$ref``; what they hold is. An object made of plain ``allOf`` members
    (inline, with only ``type``, ``properties`` and ``required``) is closed over all of their
    names instead: the names are listed in its own ``properties`` (as ``{}``; the members
    still constrain the values). Anything else built from ``allOf`` stays open. The caller's
    schema is not changed."""
    shared: set[str] = set()
    _member_refs(schema, member=False, out=shared)
    return _close(schema, "#", member=False, shared=shared)


def _member_refs(schema: Any, *, member: bool, out: set[str]) -> None:
    """The ``$ref`` targets that stand for a part of an ``allOf`` somewhere in ``schema``."""
    if isinstance(schema, list):
        for s in schema:
            _member_refs(s, member=member, out=out)
        return
    if not isinstance(schema, dict):
        return
    if member and isinstance(schema.get("$ref"), str):
        out.add(schema["$ref"])
    for key, value in schema.items():
        if key == "allOf":
            _member_refs(value, member=True, out=out)
        elif key in ("anyOf", "oneOf"):
            _member_refs(value, member=member, out=out)
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            _member_refs(list(value.values()), member=False, out=out)
        elif key in _SCHEMA_VALUES:
            _member_refs(value, member=False, out=out)


def _close(schema: Any, path: str, *, member: bool, shared: set[str]) -> Any:
    if isinstance(schema, list):
        return [_close(s, f"{path}/{i}", member=member, shared=shared)
                for i, s in enumerate(schema)]
    if not isinstance(schema, dict):
        return schema
    member = member or path in shared
    out: dict[str, Any] = {}
    for key, value in schema.items():
        here = f"{path}/{_escape(key)}"
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _close(v, f"{here}/{_escape(k)}", member=False, shared=shared)
                        for k, v in value.items()}
        elif key in ("anyOf", "oneOf"):  # alternatives of this same object
            out[key] = _close(value, here, member=member, shared=shared)
        elif key == "allOf":
            out[key] = _close(value, here, member=True, shared=shared)
        elif key in _SCHEMA_VALUES:
            out[key] = _close(value, here, member=False, shared=shared)
        else:
            out[key] = value
    if member or any(key in out for key in _OPEN_BY):
        return out
    if "allOf" in out:
        return _closed_over_members(out)
    if "properties" in out:
        out["additionalProperties"] = False
    return out


def _escape(key: str) -> str:
    """A JSON pointer's reference token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _closed_over_members(schema: dict[str, Any]) -> dict[str, Any]:
    members = schema["allOf"]
    if not all(isinstance(m, dict) and set(m) <= _PLAIN_MEMBER_KEYS
               and isinstance(m.get("properties"), dict) for m in members):
        return schema
    names: dict[str, Any] = dict(schema.get("properties") or {})
    for m in members:
        for name in m["properties"]:
            names.setdefault(name, {})
    return {**schema, "properties": names, "additionalProperties": False}
