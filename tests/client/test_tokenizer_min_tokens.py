"""``Tokenizer.min_tokens``: a lower bound on a text's token count from its bytes, so that a
text that cannot fit the context is refused before it is tokenized; only where it is safe."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from aioengine.client.inputs import chat_token_ids, check_text_fits
from aioengine.client.tokenizer import Tokenizer
from aioengine.hub import resolve_model
from tests.client.tokenizer_fixtures import MULTILINGUAL, byte_level_bpe, metaspace_bpe


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return Tokenizer.from_dir(resolve_model("tiny").tokenizer_path)


TEXTS = st.one_of(
    st.text(max_size=400),
    st.text(alphabet=st.sampled_from(" \n\t"), max_size=400),  # whitespace runs
    st.lists(st.sampled_from([*MULTILINGUAL, "<s>", "</s>", "<|im_start|>", " " * 40]),
             max_size=12).map("".join))


@settings(max_examples=150, deadline=None)
@given(text=TEXTS)
def test_bound_never_exceeds_the_real_count(tiny, text):
    for tok in (tiny, BYTE_LEVEL, METASPACE):
        assert tok.max_token_bytes is not None
        assert tok.min_tokens(text) <= len(tok.encode(text, add_special_tokens=False))


BYTE_LEVEL = Tokenizer(byte_level_bpe())
METASPACE = Tokenizer(metaspace_bpe())


def test_bound_is_tight_enough_to_refuse_a_huge_text(tiny):
    assert tiny.max_token_bytes == 75  # its longest vocabulary entry
    big = "ab " * 1_300_000
    assert tiny.min_tokens(big) == -(-len(big) // 75)
    with pytest.raises(ValueError, match=r"prompt has at least 52000 tokens .* longer than "
                                         r"the model's context \(max_model_len=8192\)"):
        check_text_fits(tiny, big, 8192)
    check_text_fits(tiny, "ab " * 100, 8192)  # fits: nothing raised


def _with(hf: HFTokenizer, **changes) -> Tokenizer:
    spec = json.loads(hf.to_str())
    spec.update(changes)
    return Tokenizer(HFTokenizer.from_str(json.dumps(spec)))


@pytest.mark.parametrize("unsafe", [
    {"normalizer": json.loads(normalizers.Lowercase().__getstate__())},  # 'K' (3 bytes) -> 'k'
    {"normalizer": json.loads(normalizers.Strip().__getstate__())},  # deletes whitespace
    {"pre_tokenizer": json.loads(pre_tokenizers.Whitespace().__getstate__())},  # drops spaces
    {"pre_tokenizer": json.loads(pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(), pre_tokenizers.WhitespaceSplit()]).__getstate__())},
])
def test_no_bound_where_text_can_vanish(unsafe):
    tok = _with(byte_level_bpe(), **unsafe)
    assert tok.max_token_bytes is None and tok.min_tokens("x" * 10_000) == 0
    check_text_fits(tok, "x" * 10_000, 2)  # no bound: left to the tokenizer's real count


def test_no_bound_for_other_models_or_whitespace_eating_tokens():
    wordpiece = HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert Tokenizer(wordpiece).max_token_bytes is None  # a whole unknown word is one [UNK]
    spec = json.loads(byte_level_bpe().to_str())
    spec["added_tokens"][0]["lstrip"] = True  # swallows the spaces before it
    assert Tokenizer(HFTokenizer.from_str(json.dumps(spec))).max_token_bytes is None


def test_a_conversation_is_bounded_after_templating(tiny):
    big = [{"role": "user", "content": "ab " * 100_000}]
    with pytest.raises(ValueError, match=r"prompt has at least \d+ tokens"):
        chat_token_ids(tiny, big, 512)
    small = [{"role": "user", "content": "hello"}]
    assert chat_token_ids(tiny, small, 512) == tiny.encode_chat(small)
