"""Structured outputs and ``logit_bias`` on the OpenAI endpoints: from the request's fields to
``SamplingParams.structured_outputs`` / ``logit_bias``, every bad value a 400 naming its field.

Three ways to ask for a constraint, at most one per request:

* OpenAI's ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}``,
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``. The schema is
  always enforced by the grammar, whatever ``strict`` says (strict only promises more).
* vLLM's ``structured_outputs`` extra body field: ``{"json" | "json_object" | "regex" |
  "choice" | "grammar": ...}``.
* vLLM's older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``.

The constraint is checked here with ``check_spec`` (no tokenizer needed), so a schema,
regex or grammar that does not compile is a 400 before the engine sees the request.
"""

from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from aioengine import SamplingParams
from aioengine.messages.sampling_params import StructuredOutputs
from aioengine.server.errors import ApiError
from aioengine.server.protocol import JsonSchemaFormat, SamplingFields, StructuredOutputsField
from aioengine.structured import spec_error

_KINDS = ("json", "json_object", "regex", "choice", "grammar")

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def structured_spec(req: SamplingFields) -> tuple[StructuredOutputs | None, str]:
    """The request's constraint (None: none) and the parameter it came from."""
    found: list[tuple[StructuredOutputs | None, str]] = []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        found.append(_from_response_format(rf.type, rf.json_schema))
    if req.structured_outputs is not None:
        found.append((_from_vllm(req.structured_outputs), "structured_outputs"))
    for field, kind in _GUIDED.items():
        value = getattr(req, field)
        if value is not None:
            found.append((_build({kind: value}, field), field))
    if rf is not None and rf.type == "text" and rf.json_schema is not None:
        raise ApiError(400, "response_format.json_schema is only allowed with type "
                       "'json_schema'", param="response_format.json_schema",
                       code="invalid_parameter")
    if len(found) > 1:
        names = ", ".join(param.split(".")[0] for _, param in found)
        raise ApiError(400, f"more than one output constraint was given ({names}); send one",
                       param=found[1][1].split(".")[0], code="invalid_parameter")
    return found[0] if found else (None, "")


def _from_response_format(kind: str, js: JsonSchemaFormat | None
                          ) -> tuple[StructuredOutputs, str]:
    if kind == "json_object":
        if js is not None:
            raise ApiError(400, "response_format.json_schema is only allowed with type "
                           "'json_schema'", param="response_format.json_schema",
                           code="invalid_parameter")
        return StructuredOutputs(json_object=True), "response_format"
    if js is None:
        raise ApiError(400, "response_format of type 'json_schema' needs a json_schema object "
                       "({\"name\": ..., \"schema\": {...}})", param="response_format.json_schema",
                       code="missing_required_parameter")
    param = "response_format.json_schema.schema"
    if js.schema is None:  # OpenAI lets it out: any JSON object
        return StructuredOutputs(json_object=True), param
    return _build({"json": js.schema}, param), param


def _from_vllm(so: StructuredOutputsField) -> StructuredOutputs:
    if so.structural_tag is not None:
        raise ApiError(400, "structured_outputs.structural_tag is not supported by this server",
                       param="structured_outputs.structural_tag", code="unsupported_parameter")
    if so.whitespace_pattern is not None:
        raise ApiError(400, "structured_outputs.whitespace_pattern is not supported: JSON is "
                       "generated compact (\", \" and \": \" separators, no other whitespace)",
                       param="structured_outputs.whitespace_pattern",
                       code="unsupported_parameter")
    # disable_fallback, disable_any_whitespace and disable_additional_properties hold already:
    # there is no fallback backend, no free whitespace in JSON, and an object that says nothing
    # of other keys admits none (aioengine.structured.schema).
    given = {k: getattr(so, k) for k in _KINDS if getattr(so, k) not in (None, False)}
    return _build(given, "structured_outputs")


def _build(fields: dict[str, Any], param: str) -> StructuredOutputs:
    try:
        spec = StructuredOutputs(**fields)
    except ValueError as e:
        raise ApiError(400, f"{param}: {e}", param=param, code="invalid_parameter") from e
    error = spec_error(spec)  # check_spec, remembered
    if error:
        raise ApiError(400, f"{param}: {error}", param=param, code="invalid_parameter")
    return spec


def logit_bias(req: SamplingFields, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's ``logit_bias``: token ids as strings (JSON keys) to a bias in [-100, 100]."""
    if not req.logit_bias:
        return None
    out: dict[int, float] = {}
    for key, bias in req.logit_bias.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if str(token) != key.strip() or not 0 <= token < vocab_size:
            raise ApiError(400, f"logit_bias key {key!r} is not a token id: keys must be "
                           f"integers in [0, {vocab_size}) written as strings",
                           param="logit_bias", code="invalid_parameter")
        if not -100.0 <= bias <= 100.0:
            raise ApiError(400, f"logit_bias[{key!r}] is {bias:g}; a bias must be in "
                           "[-100, 100]", param="logit_bias", code="invalid_parameter")
        out[token] = float(bias)
    return out


def with_structured_fields(params: SamplingParams, req: SamplingFields,
                           vocab_size: int) -> SamplingParams:
    """``params`` with the request's constraint and logit_bias (a 400 for a bad one)."""
    spec, _ = structured_spec(req)
    bias = logit_bias(req, vocab_size)
    if spec is None and bias is None:
        return params
    return replace(params, structured_outputs=spec, logit_bias=bias)
