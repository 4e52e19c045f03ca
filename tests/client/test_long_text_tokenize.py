"""Long texts take the GIL-releasing tokenizer path and give the same ids."""

from __future__ import annotations

import threading

import anyio
import pytest

from aioengine.client.tokenizer import LONG_TEXT_CHARS, Tokenizer, run_long_text
from aioengine.hub import resolve_model
from tests.client.run_on import BACKENDS


def test_long_texts_tokenize_as_short_ones_do():
    tok = Tokenizer.from_dir(resolve_model("tiny").tokenizer_path)
    text = "<|im_start|>user\nGrüße, 世界! " * (LONG_TEXT_CHARS // 10) + "<|im_end|>"
    assert len(text) > LONG_TEXT_CHARS
    for special in (True, False):
        assert tok.encode(text, special) == tok.hf.encode(text, add_special_tokens=special).ids


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_texts_go_through_the_pool_on_each_backend(backend: str) -> None:
    """``run_long_text`` awaits the long-text pool from asyncio and from trio alike, and an
    error raised in the pool reaches the awaiting task."""
    tok = Tokenizer.from_dir(resolve_model("tiny").tokenizer_path)
    text = "Grüße, 世界! " * (LONG_TEXT_CHARS // 10)

    def fails(_: str) -> None:
        raise ValueError("from the pool")

    async def main() -> tuple[list[int], str]:
        ids = await run_long_text(tok.encode, text, False)
        with pytest.raises(ValueError, match="from the pool"):
            await run_long_text(fails, text)
        return ids, threading.current_thread().name

    ids, thread = anyio.run(main, backend=backend)
    assert ids == tok.encode(text, False) and thread == "MainThread"
