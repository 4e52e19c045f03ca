"""Chat ``logprobs.content[i].bytes`` are each token's own UTF-8 bytes, so that, as OpenAI
documents, the bytes of the tokens that split a character join into that character: the
entries' bytes spell the message content (where the text itself holds U+FFFD for an invalid
sequence, so do the bytes decoded with replacement). The ``token`` texts cannot: a token
holding part of a character reads as U+FFFD on its own."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio


async def test_chat_logprob_bytes_spell_the_content(oai):
    r = await oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say something in Chinese."}],
        n=16, max_tokens=16, temperature=1.0, seed=1, logprobs=True, top_logprobs=2,
        extra_body={"ignore_eos": True})
    joined_chars = 0
    for c in r.choices:
        text, entries = c.message.content, c.logprobs.content
        spelled = b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace")
        assert spelled == text, (text, [(e.token, e.bytes) for e in entries])
        joined_chars += "".join(e.token for e in entries) != text
        for e in entries:
            for t in (e, *e.top_logprobs):
                assert bytes(t.bytes).decode("utf-8", "replace") == t.token, t
    assert joined_chars, "no sampled text had a character split over tokens: proved nothing"
