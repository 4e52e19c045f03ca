"""``logprobs`` describe exactly the returned text: the eos the text leaves out has no entry,
nor have the tokens of a stop string that cut the text off; streamed and whole agree.

The tiny model ends the completion of "x" with "." and eos under greedy decoding; in chat it
ends some sampled choices with eos (n=16 seeded choices find several). A token holding part of
a multi-byte character reads as U+FFFD on its own, so tokens spell the text exactly only where
every character is one token or more: the checks that spell it out use ASCII texts.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.anyio

EOS = "<|eos|>"
CHAT = [{"role": "user", "content": "x"}]


def assert_describes(text: str, tokens: list[str], offsets: list[int] | None = None) -> None:
    """Every token starts inside ``text`` at its offset and the tokens spell ``text``; only the
    last one may run past its end (a stop string cut through it)."""
    assert EOS not in tokens, (text, tokens)
    joined = "".join(tokens)
    assert joined[:len(text)] == text, (text, tokens)
    if tokens:
        assert len(joined) - len(tokens[-1]) < len(text), (text, tokens)
    if offsets is not None:
        assert len(offsets) == len(tokens)
        at = 0
        for token, offset in zip(tokens, offsets, strict=True):
            assert offset == at < len(text), (text, tokens, offsets)
            at += len(token)


async def test_completion_logprobs_leave_out_the_eos(oai):
    kwargs: dict[str, Any] = dict(model="tiny", prompt="x", max_tokens=16, temperature=0.0,
                                  logprobs=2)
    r = await oai.completions.create(**kwargs)
    (choice,) = r.choices
    assert choice.finish_reason == "stop", "the tiny model no longer ends 'x' with eos"
    lp = choice.logprobs
    assert choice.text and r.usage.completion_tokens == len(lp.tokens) + 1  # eos: counted
    assert_describes(choice.text, lp.tokens, lp.text_offset)
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.tokens)

    stream = await oai.completions.create(**kwargs, stream=True)
    tokens: list[str] = []
    offsets: list[int] = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
            offsets += chunk.choices[0].logprobs.text_offset
    assert (tokens, offsets) == (lp.tokens, lp.text_offset)


async def test_chat_logprobs_leave_out_the_eos(oai):
    kwargs: dict[str, Any] = dict(model="tiny", messages=CHAT, n=16, max_tokens=12,
                                  temperature=1.0, seed=0, logprobs=True, top_logprobs=1)
    r = await oai.chat.completions.create(**kwargs)
    ended_by_eos = [c for c in r.choices if c.finish_reason == "stop"]
    assert any(c.message.content.isascii() for c in ended_by_eos), \
        "no sampled chat choice of the tiny model ended with eos after an ASCII text"
    whole = {}
    for c in r.choices:
        tokens = [e.token for e in c.logprobs.content]
        assert EOS not in tokens
        if c.message.content.isascii():
            assert_describes(c.message.content, tokens)
        whole[c.index] = tokens
    assert sum(len(t) for t in whole.values()) == r.usage.completion_tokens - len(ended_by_eos)

    streamed: dict[int, list[str]] = {i: [] for i in range(16)}
    stream = await oai.chat.completions.create(**kwargs, stream=True)
    async for chunk in stream:
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed[c.index] += [e.token for e in c.logprobs.content]
    assert streamed == whole


async def test_stop_string_drops_the_tokens_it_cut_off(oai):
    # "x" -> "." then eos: a stop at "." leaves an empty text, so no token describes it.
    r = await oai.completions.create(model="tiny", prompt="x", max_tokens=16, temperature=0.0,
                                     logprobs=1, stop=["."])
    (choice,) = r.choices
    assert (choice.text, choice.finish_reason) == ("", "stop")
    assert choice.logprobs.tokens == [] and choice.logprobs.text_offset == []

    chat = await oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8,
                                             temperature=0.0, logprobs=True, stop=["\n"])
    (c,) = chat.choices
    assert (c.message.content, c.finish_reason) == ("", "stop")
    assert c.logprobs.content == []


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_mid_text(oai, stream):
    base: dict[str, Any] = dict(model="tiny", prompt="Once upon a time", max_tokens=24,
                                temperature=0.0, extra_body={"ignore_eos": True})
    full = (await oai.completions.create(**base, logprobs=1)).choices[0]
    assert full.text.isascii()
    k = len(full.logprobs.tokens) // 2
    inside = full.logprobs.text_offset[k] + 1
    # A stop that starts inside a token (it is cut through), and one of two whole tokens.
    stops = [full.text[inside:inside + 3], "".join(full.logprobs.tokens[k:k + 2])]
    for stop in stops:
        at = full.text.index(stop)
        if stream:
            chunks = await oai.completions.create(**base, logprobs=1, stop=[stop], stream=True)
            text, tokens, offsets = "", [], []
            async for chunk in chunks:
                for c in chunk.choices:
                    text += c.text
                    if c.logprobs is not None:
                        tokens += c.logprobs.tokens
                        offsets += c.logprobs.text_offset
        else:
            c = (await oai.completions.create(**base, logprobs=1, stop=[stop])).choices[0]
            assert c.finish_reason == "stop"
            text, tokens, offsets = c.text, c.logprobs.tokens, c.logprobs.text_offset
        assert text == full.text[:at]
        assert_describes(text, tokens, offsets)
        n = len(tokens)
        assert full.logprobs.tokens[:n] == tokens and full.logprobs.text_offset[:n] == offsets
