"""Logprobs on a long reply (1000 tokens): streamed and whole agree entry for entry, and they
describe the text (offsets into it, chat bytes spelling it). And the server's per-token
detokenization stays linear in the reply's length: a run of special tokens (which the text
skips) is not fed to its detokenizer, whose window would otherwise grow with the run (a
reply of 4000 of them took about 0.7 s of the event loop)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from aioengine import AsyncMPClient, EngineConfig
from aioengine.client.tokenizer import Tokenizer
from aioengine.hub import resolve_model
from aioengine.messages import TokenLogprob
from aioengine.server.logprob_spans import TokenSpans

pytestmark = pytest.mark.anyio

LONG = 1000


@pytest.fixture(scope="module")
async def engine(anyio_backend: str) -> AsyncIterator[AsyncMPClient]:
    # This module's own engine: the shared one's context is too short for a long reply.
    config = EngineConfig(model="tiny", device="cpu", max_model_len=2048, num_kv_blocks=256)
    async with AsyncMPClient(config) as client:
        yield client


async def test_completion_logprobs_agree_streamed_and_whole_on_a_long_reply(oai):
    kwargs: dict[str, Any] = dict(model="tiny", prompt="Once upon a time", max_tokens=LONG,
                                  temperature=0.0, logprobs=3, extra_body={"ignore_eos": True})
    whole = await oai.completions.create(**kwargs)
    (choice,) = whole.choices
    lp = choice.logprobs
    assert whole.usage.completion_tokens == LONG
    assert len(lp.tokens) >= LONG - 5, len(lp.tokens)  # all but a special token or so
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert all(offset < len(choice.text) for offset in lp.text_offset)

    text = ""
    got: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                 "text_offset": []}
    async for chunk in await oai.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        text += chunk.choices[0].text
        if chunk.choices[0].logprobs is not None:
            for key, values in got.items():
                values += getattr(chunk.choices[0].logprobs, key)
    assert text == choice.text
    assert got == {key: getattr(lp, key) for key in got}


async def test_chat_logprobs_agree_streamed_and_whole_on_a_long_reply(oai):
    kwargs: dict[str, Any] = dict(model="tiny", messages=[{"role": "user", "content": "x"}],
                                  max_tokens=LONG, temperature=0.0, logprobs=True,
                                  top_logprobs=2, extra_body={"ignore_eos": True})
    whole = await oai.chat.completions.create(**kwargs)
    (choice,) = whole.choices
    entries = [e.model_dump() for e in choice.logprobs.content]
    assert whole.usage.completion_tokens == LONG and len(entries) >= LONG - 5
    spelled = b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace")
    assert spelled == choice.message.content

    content = ""
    streamed: list[dict[str, Any]] = []
    async for chunk in await oai.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        content += chunk.choices[0].delta.content or ""
        if chunk.choices[0].logprobs is not None:
            streamed += [e.model_dump() for e in chunk.choices[0].logprobs.content]
    assert content == choice.message.content
    assert streamed == entries


class CountingDecoder:
    """The real ``tokenizers.Tokenizer``, counting the tokens its ``decode`` is handed."""

    def __init__(self, hf: Any) -> None:
        self._hf = hf
        self.decoded = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decoded += len(ids)
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hf, name)


def test_a_long_run_of_special_tokens_costs_linear_detokenization():
    path = resolve_model("tiny", require_tokenizer=True).tokenizer_path
    counting = CountingDecoder(Tokenizer.from_dir(path).hf)
    tokenizer = Tokenizer(counting, {}, path)  # type: ignore[arg-type]
    pad = tokenizer.hf.token_to_id("<|pad|>")
    head, tail = tokenizer.encode("Once upon a", False), tokenizer.encode(" time", False)
    ids = head + [pad] * 3000 + tail
    spans = TokenSpans(tokenizer, tokenizer.encode("x"))
    logprobs = [TokenLogprob(token_id=t, logprob=-1.0, top=[]) for t in ids]
    got = []
    counting.decoded = 0
    for i, tok in enumerate(ids):  # one token per output, as a decode step streams them
        spans.add([tok])
        got += spans.release(10**9, logprobs[:i + 1])
    spans.finish()
    got += spans.release(10**9, logprobs)
    # Every text token once, at its offset in "Once upon a time"; no pad has an entry.
    assert [e.token_id for e, _ in got] == head + tail
    text_ids = head + tail
    assert [offset for _, offset in got] == [len(tokenizer.decode(text_ids[:k]))
                                             for k in range(len(text_ids))]
    # A few tokens decoded per token added (the window and the token alone), not the run's
    # length: 3000 pads fed to the detokenizer decode ~4.5 million tokens.
    assert counting.decoded < 10 * len(ids), counting.decoded
