"""Replies that carry tool calls: the ``tool_calls`` of a whole reply, or stream deltas."""

from __future__ import annotations

import uuid

from aioengine.server.responses import (
    ChatFormat,
    ChoiceState,
    Json,
    Logprobs,
    TokenBytes,
    TokenText,
)
from aioengine.server.tool_parsers import CallDelta, Parsed, StreamParser
from aioengine.server.tools import ToolPlan


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _finish_reason(finish: str | None, has_calls: bool) -> str | None:
    return "tool_calls" if has_calls and finish == "stop" else finish


class ToolChatFormat(ChatFormat):
    """``ChatFormat`` whose replies carry ``tool_calls``: whole, or as stream deltas (a call's
    id, type and name first, then its arguments) that the openai SDK reassembles."""

    def __init__(self, model: str, token_text: TokenText, token_bytes: TokenBytes,
                 plan: ToolPlan) -> None:
        super().__init__(model, token_text, token_bytes)
        self.plan = plan
        self._streams: dict[int, StreamParser] = {}
        self._sent: dict[int, int] = {}  # choice -> calls started so far

    def full_choice(self, state: ChoiceState) -> Json:
        choice = super().full_choice(state)
        if not self.plan.parses:
            return choice
        parsed = self.plan.extract(state.text)
        message = choice["message"]
        if parsed.calls:
            # Under a grammar any text left is a call cut off by max_tokens: not content.
            message["content"] = (parsed.content or None) if self.plan.mode == "auto" else None
            message["tool_calls"] = [
                {"id": call_id(), "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.calls]
        choice["finish_reason"] = _finish_reason(state.finish_reason, bool(parsed.calls))
        return choice

    def delta_choices(self, index: int, text: str, logprobs: Logprobs | None,
                      finish_reason: str | None) -> list[Json]:
        if not self.plan.parses:
            return super().delta_choices(index, text, logprobs, finish_reason)
        parser = self._streams.get(index)
        if parser is None:
            parser = self._streams[index] = self.plan.stream_parser()
            self._sent[index] = 0
        parsed = parser.feed(text) if text else Parsed()
        if finish_reason is not None:
            parsed.add(parser.finish())
        deltas: list[Json] = []
        # Under a grammar text is a call cut off by max_tokens: content only when no call
        # was started (as in the whole reply).
        if parsed.content and (self.plan.mode == "auto" or not self._sent[index]):
            deltas.append({"content": parsed.content})
        pieces = parsed.deltas if parsed.deltas is not None else [
            d for c in parsed.calls or []
            for d in (CallDelta(-1, c.name, ""), CallDelta(-1, None, c.arguments))]
        for piece in pieces:
            if piece.name is not None:
                self._sent[index] += 1
                deltas.append({"tool_calls": [self._header(self._sent[index] - 1, piece.name)]})
            elif piece.arguments:
                deltas.append({"tool_calls": [{"index": self._sent[index] - 1,
                                               "function": {"arguments": piece.arguments}}]})
        lp = self.logprobs(logprobs) if logprobs is not None else None
        choices: list[Json] = [{"index": index, "delta": d, "logprobs": None,
                                "finish_reason": None} for d in deltas]
        if lp is not None:
            if not choices:
                choices.append({"index": index, "delta": {}, "logprobs": None,
                                "finish_reason": None})
            choices[0]["logprobs"] = lp
        if finish_reason is not None:
            end = _finish_reason(finish_reason, self._sent[index] > 0)
            if choices:
                choices[-1]["finish_reason"] = end
            else:
                choices.append({"index": index, "delta": {}, "logprobs": None,
                                "finish_reason": end})
        return choices

    @staticmethod
    def _header(n: int, name: str) -> Json:
        return {"index": n, "id": call_id(), "type": "function",
                "function": {"name": name, "arguments": ""}}
