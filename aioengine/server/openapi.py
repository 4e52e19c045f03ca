"""``GET /openapi.json``: the API's OpenAPI 3.1 description, generated from the same msgspec
request structs the handlers decode with (msgspec emits their JSON Schema), so it cannot
drift from what the server accepts."""

from __future__ import annotations

from typing import Any

import msgspec

from aioengine import __version__
from aioengine.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from aioengine.server.embeddings_routes import EmbeddingsRequest
from aioengine.server.openai_responses.protocol import ResponsesRequest
from aioengine.server.protocol import ChatCompletionRequest, CompletionRequest
from aioengine.server.rerank_routes import RerankRequest, ScoreRequest
from aioengine.server.tokenize_routes import DetokenizeRequest, TokenizeRequest

_POSTS = {"/v1/chat/completions": (ChatCompletionRequest, "Chat completion"),
          "/v1/completions": (CompletionRequest, "Text completion"),
          "/tokenize": (TokenizeRequest, "Tokenize a prompt or messages"),
          "/detokenize": (DetokenizeRequest, "Token ids back to text"),
          "/v1/messages": (MessagesRequest, "Anthropic Messages API (errors in its shape)"),
          "/v1/messages/count_tokens": (CountTokensRequest,
                                        "Anthropic Messages API: count a prompt's tokens"),
          "/v1/responses": (ResponsesRequest, "OpenAI Responses API"),
          "/v1/embeddings": (EmbeddingsRequest, "Embeddings (an embedding model)"),
          "/v1/rerank": (RerankRequest, "Rerank documents for a query (a reranker)"),
          "/v2/rerank": (RerankRequest, "Rerank, as /v1/rerank (Cohere's v2 path)"),
          "/score": (ScoreRequest, "Score text pairs (a reranker)")}
_GETS = {"/v1/models": "The served model", "/v1/models/{model}": "One model's card",
         "/version": "The server's version", "/health": "200 while the engine answers",
         "/metrics": "Prometheus text exposition",
         "/v1/responses/{response_id}": "A stored response (Responses API)"}
_DELETES = {"/v1/responses/{response_id}": "Delete a stored response (Responses API)"}
_ERRORS = {"400": "Invalid request", "401": "Missing or wrong API key",
           "404": "Unknown model or route", "413": "Body too large",
           "415": "Not JSON", "503": "Overloaded, or the engine is dead"}


def openapi_document(api_keys: bool) -> dict[str, Any]:
    types = [t for t, _ in _POSTS.values()]
    schemas, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}")
    error = {"description": "", "content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "object"}}}}}}
    responses = {code: dict(error, description=text) for code, text in _ERRORS.items()}
    paths: dict[str, Any] = {}
    for (path, (_, summary)), schema in zip(_POSTS.items(), schemas, strict=True):
        paths[path] = {"post": {
            "summary": summary,
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}},
            "responses": {"200": {"description": "JSON, or text/event-stream with "
                                                 "\"stream\": true"}, **responses}}}
    for method, ops in (("get", _GETS), ("delete", _DELETES)):
        for path, summary in ops.items():
            operation: dict[str, Any] = {"summary": summary, "responses": {"200": {
                "description": summary}}}
            if "{" in path:
                name = path.rsplit("{", 1)[1].rstrip("}")
                operation["parameters"] = [{"name": name, "in": "path", "required": True,
                                            "schema": {"type": "string"}}]
                operation["responses"]["404"] = responses["404"]
            paths.setdefault(path, {})[method] = operation
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "aioengine OpenAI-compatible API", "version": __version__},
        "paths": paths, "components": {"schemas": components}}
    if api_keys:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
        doc["security"] = [{"bearer": []}, {"x-api-key": []}]
    return doc


def _type(schema: dict[str, Any]) -> str:
    """A short human form of a JSON Schema type: ``integer ≥ 1``, ``string | null``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " \\| ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{v!r}`".replace("'", '"') for v in schema["enum"])
    if "const" in schema:
        return f"`\"{schema['const']}\"`"
    kind = str(schema.get("type", "any"))
    if kind == "array":
        kind = f"array of {_type(schema.get('items', {}))}"
    bounds = [f"{sign} {schema[key]}" for key, sign in (
        ("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"),
        ("exclusiveMaximum", "<"), ("minLength", "length ≥"), ("maxLength", "length ≤"),
        ("minItems", "items ≥"), ("maxItems", "items ≤")) if key in schema]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | type | default |", "|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        default = "required" if name in required else (
            f"`{msgspec.json.encode(prop['default']).decode()}`" if "default" in prop else "")
        rows.append(f"| `{name}` | {_type(prop)} | {default} |")
    return rows


def openapi_markdown(doc: dict[str, Any] | None = None) -> str:
    """The OpenAPI document as Markdown (the docs' HTTP API page is built from it): every
    route, and every request schema's fields with their types, bounds and defaults."""
    doc = doc or openapi_document(False)
    lines = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            lines += [f"### `{method.upper()} {path}`", "", op["summary"] + ".", ""]
            body = op.get("requestBody")
            if body:
                ref = body["content"]["application/json"]["schema"]
                lines += [f"Body: {_type(ref)}.", ""]
    lines += ["## Schemas", ""]
    for name, schema in doc["components"]["schemas"].items():
        lines += [f"### {name}", ""]
        if "properties" in schema:
            lines += [*_fields(schema), ""]
        else:
            lines += [f"One of: {_type(schema)}.", ""]
    return "\n".join(lines)
