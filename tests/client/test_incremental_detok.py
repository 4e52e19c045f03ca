"""Incremental detokenization equals the full decode, with no broken character in any delta."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from aioengine.messages import AddRequest, RequestDelta, SamplingParams
from aioengine.text.detokenize import EngineDetokenizer, IncrementalDetokenizer
from tests.client.tokenizer_fixtures import MULTILINGUAL


def stream(tok: Tokenizer, prompt: list[int], ids: list[int], chunk: int = 1,
           skip: bool = True) -> list[str]:
    d = IncrementalDetokenizer(tok, prompt, skip)
    out = [d.step(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    out.append(d.flush())
    return out


@pytest.mark.parametrize("text", MULTILINGUAL)
@pytest.mark.parametrize("chunk", [1, 3])
def test_multilingual_byte_level(bbpe: Tokenizer, text: str, chunk: int) -> None:
    ids = bbpe.encode(text).ids
    # The small vocabulary really does split characters across tokens.
    assert any("\ufffd" in bbpe.decode([t]) for t in ids) or text.isascii()
    deltas = stream(bbpe, [], ids, chunk)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("text", MULTILINGUAL)
def test_multilingual_after_prompt(bbpe: Tokenizer, text: str) -> None:
    prompt = bbpe.encode("Translate: ").ids
    ids = bbpe.encode(text).ids
    deltas = stream(bbpe, prompt, ids)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("text", MULTILINGUAL[:4])
def test_metaspace_keeps_word_spaces(spbpe: Tokenizer, text: str) -> None:
    """Sentencepiece-style decoders drop a lone token's leading space; the window keeps it."""
    ids = spbpe.encode(text).ids
    deltas = stream(spbpe, [], ids)
    assert "".join(deltas) == spbpe.decode(ids)
    assert all("\ufffd" not in d for d in deltas)
    # After a prompt, the first word's space is kept, as in the full decode.
    prompt = spbpe.encode("Story:").ids
    continued = "".join(stream(spbpe, prompt, ids))
    full = spbpe.decode(prompt + ids)
    assert continued == full[len(spbpe.decode(prompt)):]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_token_sequences_match_full_decode(bbpe: Tokenizer, data: st.DataObject) -> None:
    """Random ids form random byte strings: invalid UTF-8 in the middle, truncated characters
    at the end. Deltas still concatenate to the full decode, and only the final flush may end
    in U+FFFD."""
    vocab = bbpe.get_vocab_size()
    ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40))
    chunk = data.draw(st.integers(1, 4))
    for skip in (True, False):
        deltas = stream(bbpe, [], ids, chunk, skip)
        assert "".join(deltas) == bbpe.decode(ids, skip_special_tokens=skip)
        assert not any(d.endswith("\ufffd") for d in deltas[:-1])


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(min_size=1, max_size=60))
def test_random_bytes_as_byte_tokens(bbpe: Tokenizer, raw: bytes) -> None:
    """Each byte as its own byte-level token: the stream decodes like bytes.decode(replace)."""
    alphabet = _byte_to_unicode()
    ids = [bbpe.token_to_id(alphabet[b]) for b in raw]
    deltas = stream(bbpe, [], ids)
    assert "".join(deltas) == raw.decode("utf-8", errors="replace") == bbpe.decode(ids)


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable-character map used by ByteLevel.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def test_prompt_ending_mid_character(bbpe: Tokenizer) -> None:
    ids = bbpe.encode("森林里").ids
    split = next(i for i in range(1, len(ids)) if bbpe.decode(ids[:i]).endswith("\ufffd"))
    text = "".join(stream(bbpe, ids[:split], ids[split:]))
    assert "\ufffd" not in text
    assert bbpe.decode(ids).endswith(text)


def test_engine_detokenizer_fills_new_text(bbpe: Tokenizer) -> None:
    det = EngineDetokenizer(bbpe)
    ids = bbpe.encode(MULTILINGUAL[5]).ids
    det.add(AddRequest("a", [1, 2], SamplingParams(), 0.0))
    det.add(AddRequest("b", [1, 2], SamplingParams(), 0.0))
    texts = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        deltas = [RequestDelta("a", [t], finish_reason="length" if last else None),
                  RequestDelta("unknown", [t])]
        det.fill(deltas)
        texts.append(deltas[0].new_text)
        assert deltas[1].new_text is None
    assert "".join(texts) == MULTILINGUAL[5]
    assert len(det) == 1  # "a" was freed on finish; "b" stays until dropped
    det.drop(["b"])
    assert len(det) == 0
