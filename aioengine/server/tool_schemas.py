"""JSON schemas for tool calls: one schema for a whole call of any allowed function (local
``$ref`` pointers rebased under it). Its objects are closed to their declared parameters by
``aioengine.structured.schema.closed_objects``, as response_format's are."""

from __future__ import annotations

from typing import Any

from aioengine.server.responses import Json


def _has_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(_has_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_ref(v) for v in schema)
    return False


def _rebase_refs(schema: Any, base: str) -> Any:
    """Local pointers (``#...``) made relative to ``base`` instead of the document root."""
    if isinstance(schema, list):
        return [_rebase_refs(v, base) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebase_refs(v, base) for k, v in schema.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = base + ref[1:]
    return out


def call_schema(names: list[str], schemas: dict[str, Json]) -> Json:
    """One JSON schema for a whole call of any of ``names`` (keys of ``schemas``, the functions'
    parameters): ``{"name": <const>, "arguments": <its parameters>}``. A parameters schema with
    ``$ref`` pointers (nested pydantic models: ``#/$defs/Item``) moves under the root's
    ``$defs`` with its pointers rewritten, so they still resolve there."""
    defs: Json = {}
    items = []
    for k, name in enumerate(names):
        args = schemas[name]
        if _has_ref(args):
            defs[f"tool{k}"] = _rebase_refs(args, f"#/$defs/tool{k}")
            args = {"$ref": f"#/$defs/tool{k}"}
        items.append({"type": "object",
                      "properties": {"name": {"const": name}, "arguments": args},
                      "required": ["name", "arguments"], "additionalProperties": False})
    root: Json = items[0] if len(items) == 1 else {"anyOf": items}
    return {**root, "$defs": defs} if defs else root
