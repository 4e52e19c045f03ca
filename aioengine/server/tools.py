"""Tool calling on ``/v1/chat/completions``: ``tools``, ``tool_choice``, ``parallel_tool_calls``,
tool calls in the history, and the calls in the reply (whole or streamed as deltas).

How each ``tool_choice`` is served:

- ``none``: the model answers with text (a template that renders tools still gets them).
- ``auto`` (the default with tools): the model writes freely; the server's tool-call parser
  (``--tool-call-parser``, ``tool_parsers``) finds the calls in the model's own format.
- ``required`` and a named function: a grammar built from the tools' parameter schemas makes
  the reply a call whose arguments match its schema, so even a weak model returns a valid one.
  The calls are written in the parser's own format (``<tool_call>`` blocks for ``hermes``),
  the one the model was taught and the parser reads back; one call unless
  ``parallel_tool_calls`` (a model can end its reply after any call).

A chat template that does not mention ``tools`` (SmolLM2's, the tiny model's) gets the Hermes
format instead: the tools described in the system message, past calls written as
``<tool_call>`` blocks and tool results as ``<tool_response>`` user turns, the format the
``hermes`` parser reads.

This module checks the request and keeps its plan; ``tool_schemas`` builds the call schema,
``tool_prompts`` renders tools and calls for the template, ``tool_replies`` writes the calls
into the reply.
"""

from __future__ import annotations

import functools
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET
from msgspec.structs import replace

from aioengine import SamplingParams
from aioengine.messages.sampling_params import StructuredOutputs
from aioengine.server.errors import ApiError
from aioengine.server.protocol import ChatCompletionRequest, ChatMessage, NamedToolChoice
from aioengine.server.responses import Json
from aioengine.server.tool_parsers import Parsed, StreamParser, get_parser
from aioengine.server.tool_prompts import NO_ARGUMENTS, function_dict
from aioengine.server.tool_schemas import call_schema
from aioengine.structured import GrammarError, check_spec, closed_objects

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_LENIENT = {"lenient": True}  # llguidance: skip keywords it does not implement


@dataclass
class ToolPlan:
    """What one request asked of the tools: the mode, and what the template and parser need."""

    mode: str  # "none" | "auto" | "required" | "named"
    tools: list[Json]
    parallel: bool = True
    name: str | None = None  # the named function
    parser_name: str = "hermes"
    schemas: dict[str, Json] = field(default_factory=dict)

    @property
    def parses(self) -> bool:
        return self.mode != "none"

    @functools.cached_property
    def call_grammar(self) -> str | None:
        """For ``required`` and named choices: the calls in the parser's own format (the one
        the model was taught), one or (``required`` with ``parallel``) more."""
        if self.mode not in ("required", "named"):
            return None
        names = [self.name] if self.mode == "named" and self.name else list(self.schemas)
        return get_parser(self.parser_name).call_grammar(
            call_schema(names, self.schemas), self.parallel and self.mode == "required")

    def grammar(self) -> StructuredOutputs | None:
        """The constraint for ``required`` and named choices; None for the others."""
        lark = self.call_grammar
        return None if lark is None else StructuredOutputs(grammar=lark)

    def stream_parser(self) -> StreamParser:
        return _OnlyFirst(get_parser(self.parser_name).stream(), self.parallel)

    def extract(self, text: str) -> Parsed:
        """The reply's content and calls (whole)."""
        out = get_parser(self.parser_name).extract(text)
        if out.calls and not self.parallel:
            out.calls = out.calls[:1]
        return out


def plan_tools(req: ChatCompletionRequest, params: SamplingParams, parser_name: str
               ) -> tuple[ToolPlan | None, SamplingParams]:
    """Check ``tools``/``tool_choice``/``parallel_tool_calls`` (400 naming the field) and the
    tool calls in the history; return the plan (None: no tools) and the params, with the
    grammar for ``required``/named choices."""
    check_tool_history(req.messages)
    if req.tools is None or (not req.tools and req.tool_choice in (None, "none")):
        if req.tool_choice is not None and req.tool_choice != "none":
            raise ApiError(400, "tool_choice needs tools: send the functions in `tools`",
                           param="tool_choice", code="invalid_parameter")
        return None, params
    if not req.tools:
        raise ApiError(400, "tools is empty; send at least one function, or leave tools out",
                       param="tools", code="invalid_parameter")
    # Agents send the same tools with every request: their checks and grammar are kept.
    key = msgspec.json.encode((req.tools, req.tool_choice, req.parallel_tool_calls,
                               parser_name))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _new_plan(req, parser_name)
        _PLANS[key] = plan
        if len(_PLANS) > _PLAN_CACHE:
            _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(key)
    spec = plan.grammar()
    if spec is not None:
        if params.structured_outputs is not None:
            raise ApiError(400, f"tool_choice {_choice_text(req.tool_choice)} constrains the "
                           "reply to a tool call; it cannot be combined with response_format "
                           "or structured_outputs", param="tool_choice",
                           code="invalid_parameter")
        params = replace(params, structured_outputs=spec)
    return plan, params


_PLAN_CACHE = 256
_PLANS: OrderedDict[bytes, ToolPlan] = OrderedDict()


def _new_plan(req: ChatCompletionRequest, parser_name: str) -> ToolPlan:
    """The checked plan for ``req``'s tools and choice (400 naming what is wrong)."""
    assert req.tools
    schemas: dict[str, Json] = {}
    tools: list[Json] = []
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    # Only the schemas a call grammar is built from must compile strictly; the others only go
    # into the prompt, so a keyword the grammar lacks (Claude Code's tools use propertyNames)
    # is skipped in their check (llguidance's lenient mode), a malformed schema still is not.
    in_grammar = (choice.function.name if isinstance(choice, NamedToolChoice)
                  else None if choice == "required" else "")
    for i, tool in enumerate(req.tools):
        fn = tool.function
        if not _NAME.fullmatch(fn.name):
            raise ApiError(400, f"tools[{i}].function.name must be 1 to 64 letters, digits, "
                           f"underscores or dashes, got {fn.name!r}",
                           param=f"tools[{i}].function.name", code="invalid_parameter")
        if fn.name in schemas:
            raise ApiError(400, f"tools[{i}]: a second function named {fn.name!r}; names must "
                           "be unique", param=f"tools[{i}].function.name",
                           code="invalid_parameter")
        schema = fn.parameters if fn.parameters is not None else NO_ARGUMENTS
        strict = in_grammar is None or in_grammar == fn.name
        try:
            check_spec(StructuredOutputs(json=schema if strict or not isinstance(schema, dict)
                                         else {**schema, "x-guidance": _LENIENT}))
        except (GrammarError, ValueError) as e:
            raise ApiError(400, f"tools[{i}].function.parameters is not a usable JSON schema: "
                           f"{e}", param=f"tools[{i}].function.parameters",
                           code="invalid_parameter") from e
        schemas[fn.name] = closed_objects(schema)
        tools.append({"type": "function", "function": function_dict(fn)})
    plan = ToolPlan(mode="auto", tools=tools, schemas=schemas, parser_name=parser_name,
                    parallel=req.parallel_tool_calls is not False)
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in schemas:
            raise ApiError(400, f"tool_choice names function {choice.function.name!r}, which "
                           f"is not in tools ({', '.join(schemas)})",
                           param="tool_choice.function.name", code="invalid_parameter")
        plan.mode, plan.name = "named", choice.function.name
    else:
        plan.mode = choice
    spec = plan.grammar()
    if spec is not None:
        try:  # each schema compiled alone; together they may not (a pointer gone astray)
            check_spec(spec)
        except GrammarError as e:
            raise ApiError(400, f"the tools' parameter schemas do not compile into a call "
                           f"grammar: {e}", param="tools", code="invalid_parameter") from e
    return plan


def _choice_text(choice: Any) -> str:
    return repr(choice) if isinstance(choice, str) else f"{{function: {choice.function.name}}}"


def check_tool_history(messages: list[ChatMessage]) -> None:
    """Every call in an assistant's ``tool_calls`` has an id, a known-good name and arguments
    that are a JSON object; every ``tool`` message has content and answers one of those ids;
    ``tool_call_id`` appears only on ``tool`` messages."""
    ids: set[str] = set()
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            for j, call in enumerate(m.tool_calls):
                where = f"messages[{i}].tool_calls[{j}]"
                if not call.id:
                    raise ApiError(400, f"{where}.id must be a non-empty string",
                                   param=f"{where}.id", code="invalid_parameter")
                if not call.function.name:
                    raise ApiError(400, f"{where}.function.name must be a non-empty string",
                                   param=f"{where}.function.name", code="invalid_parameter")
                _arguments_object(call.function.arguments, f"{where}.function.arguments")
                ids.add(call.id)
        if m.role == "tool":
            if not isinstance(m.tool_call_id, str) or not m.tool_call_id:
                raise ApiError(400, f"messages[{i}]: a 'tool' message needs tool_call_id, the "
                               "id of the call it answers", param=f"messages[{i}].tool_call_id",
                               code="missing_required_parameter")
            if m.tool_call_id not in ids:
                raise ApiError(400, f"messages[{i}]: tool_call_id {m.tool_call_id!r} answers no "
                               "tool call of an earlier assistant message",
                               param=f"messages[{i}].tool_call_id", code="invalid_parameter")
        elif m.tool_call_id is not UNSET and m.tool_call_id is not None:
            raise ApiError(400, f"unsupported parameter `tool_call_id` in messages[{i}]: only a "
                           f"'tool' message has it, not a '{m.role}' message",
                           param=f"messages[{i}].tool_call_id", code="unsupported_parameter")


def _arguments_object(text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ApiError(400, f"{where} must be a JSON object's text: {e}", param=where,
                       code="invalid_parameter") from e
    if not isinstance(value, dict):
        raise ApiError(400, f"{where} must be a JSON object's text, got a JSON "
                       f"{type(value).__name__}", param=where, code="invalid_parameter")
    return value


class _OnlyFirst(StreamParser):
    """``parallel_tool_calls: false`` in auto mode: calls after the first are dropped."""

    def __init__(self, inner: StreamParser, parallel: bool) -> None:
        self._inner = inner
        self._parallel = parallel
        self._seen = 0

    def _cut(self, out: Parsed) -> Parsed:
        if out.calls and not self._parallel:
            out.calls = out.calls[:max(0, 1 - self._seen)]
        if out.deltas and not self._parallel:
            out.deltas = [d for d in out.deltas if d.index == 0]
        self._seen += len(out.calls or [])
        return out

    def feed(self, text: str) -> Parsed:
        return self._cut(self._inner.feed(text))

    def finish(self) -> Parsed:
        return self._cut(self._inner.finish())
