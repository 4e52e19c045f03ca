"""``Tokenizer.token_bytes``: the bytes one token stands for, the raw ones where its text alone
is U+FFFD, so that the bytes of the tokens splitting a character join into it."""

from __future__ import annotations

from aioengine.client.tokenizer import Tokenizer
from aioengine.hub.tiny import ensure_tiny


def test_the_bytes_of_tokens_splitting_characters_join_into_them():
    tok = Tokenizer.from_dir(ensure_tiny())
    text = "ご 😀 héllo <|eos|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tok.decode([i]) for i in ids), "no character split over tokens"
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
