"""``GET /openapi.json``: the API's OpenAPI 3.1 description, generated from the same msgspec
request structs the handlers decode with (msgspec emits their JSON Schema), so it cannot
drift from what the server accepts."""

from __future__ import annotations

from typing import Any

import msgspec

from aioengine import __version__
from aioengine.server.protocol import ChatCompletionRequest, CompletionRequest
from aioengine.server.tokenize_routes import DetokenizeRequest, TokenizeRequest

_POSTS = {"/v1/chat/completions": (ChatCompletionRequest, "Chat completion"),
          "/v1/completions": (CompletionRequest, "Text completion"),
          "/tokenize": (TokenizeRequest, "Tokenize a prompt or messages"),
          "/detokenize": (DetokenizeRequest, "Token ids back to text")}
_GETS = {"/v1/models": "The served model", "/v1/models/{model}": "One model's card",
         "/version": "The server's version", "/health": "200 while the engine answers",
         "/metrics": "Prometheus text exposition"}
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
    for path, summary in _GETS.items():
        operation: dict[str, Any] = {"summary": summary, "responses": {"200": {
            "description": summary}}}
        if "{model}" in path:
            operation["parameters"] = [{"name": "model", "in": "path", "required": True,
                                        "schema": {"type": "string"}}]
        paths[path] = {"get": operation}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "aioengine OpenAI-compatible API", "version": __version__},
        "paths": paths, "components": {"schemas": components}}
    if api_keys:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
