"""Long texts take the GIL-releasing tokenizer path and give the same ids."""

from __future__ import annotations

from aioengine.client.tokenizer import LONG_TEXT_CHARS, Tokenizer
from aioengine.hub import resolve_model


def test_long_texts_tokenize_as_short_ones_do():
    tok = Tokenizer.from_dir(resolve_model("tiny").tokenizer_path)
    text = "<|im_start|>user\nGrüße, 世界! " * (LONG_TEXT_CHARS // 10) + "<|im_end|>"
    assert len(text) > LONG_TEXT_CHARS
    for special in (True, False):
        assert tok.encode(text, special) == tok.hf.encode(text, add_special_tokens=special).ids
