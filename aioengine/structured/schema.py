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
# What a part of an object may hold for its property names to be merged into the object's.
_PLAIN_MEMBER_KEYS = frozenset(("type", "properties", "required", "title", "description"))


def closed_objects(schema: Any) -> Any:
    """A copy of ``schema`` in which every object schema that lists ``properties`` and says
    nothing of other keys has ``additionalProperties: false``, at any depth (``properties``,
    ``$defs``/``definitions``, ``items``, ``prefixItems``, ``anyOf``, ``oneOf``, ``allOf``).

    An object may be spread over parts: the members of its ``allOf``, and the alternatives of
    its ``anyOf``/``oneOf`` when it lists properties of its own. A part is never closed alone
    (it would reject the other parts' keys), nor are the alternatives within it or a
    definition it points to with ``$ref``; what they hold is. An object whose parts are plain
    (inline, with only ``type``, ``properties`` and ``required``) is closed over all of their
    names: they are listed in its own ``properties`` (as ``{}``; the parts still constrain
    the values). Any other object with parts stays open. The caller's schema is not
    changed."""
    shared: set[str] = set()
    _part_refs(schema, part=False, out=shared)
    return _close(schema, "#", part=False, shared=shared)


def _part_keys(schema: dict[str, Any]) -> tuple[str, ...]:
    """Which of ``schema``'s keys hold parts of the one object it describes."""
    if "properties" in schema or "allOf" in schema:
        return ("allOf", "anyOf", "oneOf")
    return ("allOf",)  # alternatives alone are objects of their own: each closed


def _part_refs(schema: Any, *, part: bool, out: set[str]) -> None:
    """The ``$ref`` targets that stand for a part of an object somewhere in ``schema``."""
    if isinstance(schema, list):
        for s in schema:
            _part_refs(s, part=part, out=out)
        return
    if not isinstance(schema, dict):
        return
    if part and isinstance(schema.get("$ref"), str):
        out.add(schema["$ref"])
    parts = _part_keys(schema)
    for key, value in schema.items():
        if key in parts:
            _part_refs(value, part=True, out=out)
        elif key in ("anyOf", "oneOf"):
            _part_refs(value, part=part, out=out)
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            _part_refs(list(value.values()), part=False, out=out)
        elif key in _SCHEMA_VALUES:
            _part_refs(value, part=False, out=out)


def _close(schema: Any, path: str, *, part: bool, shared: set[str]) -> Any:
    if isinstance(schema, list):
        return [_close(s, f"{path}/{i}", part=part, shared=shared)
                for i, s in enumerate(schema)]
    if not isinstance(schema, dict):
        return schema
    part = part or path in shared
    parts = _part_keys(schema)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        here = f"{path}/{_escape(key)}"
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _close(v, f"{here}/{_escape(k)}", part=False, shared=shared)
                        for k, v in value.items()}
        elif key in parts:
            out[key] = _close(value, here, part=True, shared=shared)
        elif key in ("anyOf", "oneOf"):  # alternatives of what this schema is
            out[key] = _close(value, here, part=part, shared=shared)
        elif key in _SCHEMA_VALUES:
            out[key] = _close(value, here, part=False, shared=shared)
        else:
            out[key] = value
    if part or any(key in out for key in _OPEN_BY):
        return out
    spread = [p for key in parts if isinstance(out.get(key), list) for p in out[key]]
    if spread:
        return _closed_over_parts(out, spread)
    if "properties" in out:
        out["additionalProperties"] = False
    return out


def _escape(key: str) -> str:
    """A JSON pointer's reference token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _closed_over_parts(schema: dict[str, Any], parts: list[Any]) -> dict[str, Any]:
    if not all(isinstance(p, dict) and set(p) <= _PLAIN_MEMBER_KEYS
               and isinstance(p.get("properties"), dict) for p in parts):
        return schema
    names: dict[str, Any] = dict(schema.get("properties") or {})
    for p in parts:
        for name in p["properties"]:
            names.setdefault(name, {})
    return {**schema, "properties": names, "additionalProperties": False}
