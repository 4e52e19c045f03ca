"""Chat templates, stop strings, request state and input checks (no processes needed)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from aioengine.client.chat_template import ChatTemplate, ChatTemplateError, pick_template
from aioengine.client.inputs import (
    check_params,
    check_priority,
    check_request_id,
    prompt_token_ids,
)
from aioengine.client.request_state import RequestState
from aioengine.client.stop import StopStrings
from aioengine.client.tokenizer import Tokenizer as ClientTokenizer
from aioengine.messages import RequestDelta, SamplingParams, StructuredOutputs, TokenLogprob
from tests.client.tokenizer_fixtures import MULTILINGUAL, write_tokenizer_dir

# ---- chat templates -------------------------------------------------------------------------


def test_chat_template_renders_like_hf(bbpe_dir: str) -> None:
    tok = ClientTokenizer.from_dir(bbpe_dir)
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    assert tok.eos_token_id == tok.hf.token_to_id("</s>") is not None
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bonjour €"}]
    text = tok.apply_chat_template(msgs)
    assert text == "<s><|system|>Be brief.</s><|user|>Bonjour €</s><|assistant|>"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("€</s>")
    ids = tok.encode_chat(msgs)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_chat_template_helpers() -> None:
    t = ChatTemplate("{{ messages | tojson }}{% if not messages[0].content %}"
                     "{{ raise_exception('empty content') }}{% endif %}")
    assert t.render([{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]'
    with pytest.raises(ChatTemplateError, match="empty content"):
        t.render([{"role": "user", "content": ""}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    assert pick_template([{"name": "tool_use", "template": "a"},
                          {"name": "default", "template": "b"}]) == "b"


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"content": "x"}], r"messages\[0\]\['role'\]"),
    ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\]"),
    (["user: hi"], r"messages\[0\] must be a dict"),
])
def test_bad_messages(bbpe_dir: str, messages: object, match: str) -> None:
    tok = ClientTokenizer.from_dir(bbpe_dir)
    with pytest.raises(ValueError, match=match):
        tok.apply_chat_template(messages)  # type: ignore[arg-type]


def test_no_chat_template(tmp_path, bbpe: Tokenizer) -> None:
    tok = ClientTokenizer.from_dir(write_tokenizer_dir(str(tmp_path), bbpe, chat_template=None))
    with pytest.raises(ValueError, match="has no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_missing_tokenizer_dir(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        ClientTokenizer.from_dir(str(tmp_path / "does-not-exist"))


# ---- stop strings and request state --------------------------------------------------------

def test_stop_strings_find_and_holdback() -> None:
    s = StopStrings(["END", "\n\n"], include_in_output=False)
    assert s.find("abc EN", 4) is None
    assert s.find("abc END more", 6) == (4, "END")
    assert s.holdback("abc EN") == 2
    assert s.holdback("abc E") == 1
    assert s.holdback("abc\n") == 1
    assert s.holdback("abc") == 0
    assert StopStrings(["END"], include_in_output=True).find("xEND", 3) == (4, "END")


def feed(tok: Tokenizer, text: str, params: SamplingParams, *, finish: str = "length"
         ) -> tuple[RequestState, list[str], list[bool]]:
    """Stream ``text`` token by token through a RequestState, taking an output after each."""
    ids = tok.encode(text).ids
    st = RequestState("r", [1], params, ClientTokenizer(tok).detokenizer([1]), 0.0)
    deltas, aborts = [], []
    for i, t in enumerate(ids):
        aborts.append(st.apply(RequestDelta("r", [t], finish_reason=finish
                                            if i == len(ids) - 1 else None), float(i)))
        if st.has_news():
            deltas.append(st.take_output().delta_text)
        if st.finished:
            break
    return st, deltas, aborts


def test_stop_string_cut_and_engine_told(bbpe: Tokenizer) -> None:
    text = "Once upon a time, there was a little fox who lived in the forest."
    st, deltas, aborts = feed(bbpe, text, SamplingParams(stop=["little fox"]))
    assert st.finish_reason == "stop" and st.stop_reason == "little fox"
    assert "".join(deltas) == "Once upon a time, there was a "
    assert aborts[-1] is True and not any(aborts[:-1])
    # Token ids stop at the token that completed the stop string.
    assert bbpe.decode(st.output_ids).endswith("little fox")
    # No delta ever showed a piece of the stop string that was later withdrawn.
    assert all("little" not in d for d in deltas)


def test_stop_string_included(bbpe: Tokenizer) -> None:
    text = MULTILINGUAL[1]
    _, deltas, _ = feed(bbpe, text, SamplingParams(stop=["renard"],
                                                    include_stop_str_in_output=True))
    assert "".join(deltas) == "Il était une fois un petit renard"


def test_stop_string_waits_for_min_tokens(bbpe: Tokenizer) -> None:
    st, deltas, _ = feed(bbpe, "a fox, a fox, a fox", SamplingParams(stop=["fox"], min_tokens=5))
    assert st.finish_reason == "stop"
    assert "".join(deltas) == "a fox, a "


def test_no_stop_finishes_with_engine_reason(bbpe: Tokenizer) -> None:
    st, deltas, aborts = feed(bbpe, MULTILINGUAL[6], SamplingParams(stop=["nothing"]))
    assert st.finish_reason == "length" and not any(aborts)
    assert "".join(deltas) == MULTILINGUAL[6]


def test_lagging_consumer_gets_merged_output(bbpe: Tokenizer) -> None:
    ids = bbpe.encode(MULTILINGUAL[7]).ids
    st = RequestState("r", [1], SamplingParams(logprobs=0), ClientTokenizer(bbpe).detokenizer([1]),
                      0.0)
    first = ids[:3]
    st.apply(RequestDelta("r", first, [TokenLogprob(t, -0.5) for t in first]), 1.0)
    out1 = st.take_output()
    for j, t in enumerate(ids[3:]):  # many steps while nobody consumes
        st.apply(RequestDelta("r", [t], [TokenLogprob(t, -1.0)],
                              finish_reason="length" if j == len(ids) - 4 else None), 2.0 + j)
    out2 = st.take_output()
    assert out2.delta_token_ids == ids[3:] and out2.token_ids == ids
    assert out1.text + out2.delta_text == out2.text == MULTILINGUAL[7]
    assert out2.finished and not st.has_news()
    assert [lp.token_id for lp in out2.logprobs] == ids
    assert out2.metrics.time_to_first_token == 1.0
    assert len(out2.metrics.inter_token_latencies) == len(ids) - 3


# ---- input checks --------------------------------------------------------------------------

def test_input_checks(bbpe_dir: str) -> None:
    tok = ClientTokenizer.from_dir(bbpe_dir)
    assert prompt_token_ids(tok, "hello", 64) == tok.encode("hello")
    with pytest.raises(ValueError, match="max_model_len=8"):
        prompt_token_ids(tok, list(range(9)), 8)
    with pytest.raises(ValueError, match="position 1"):
        prompt_token_ids(tok, [1, tok.vocab_size], 64)
    with pytest.raises(ValueError, match="prompt is empty"):
        prompt_token_ids(tok, "", 64)
    with pytest.raises(ValueError, match="string or a list"):
        prompt_token_ids(tok, 42, 64)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already in use"):
        check_request_id("a", {"a"})
    assert len(check_request_id(None, set())) == 32
    assert check_priority(-(2**63)) == -(2**63)
    with pytest.raises(ValueError, match="priority must be an integer in"):
        check_priority(2**63)  # past what the wire carries (int64)
    p = SamplingParams()
    p.max_tokens = 0  # mutated after construction: still caught
    with pytest.raises(ValueError, match="max_tokens"):
        check_params(p, 100)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        check_params(SamplingParams(stop_token_ids=[100]), 100)
    with pytest.raises(ValueError, match=r"logit_bias token ids \[100\] are outside the vocab"):
        check_params(SamplingParams(logit_bias={5: 1.0, 100: -100.0}), 100)
    # A constraint that does not compile is refused before it is sent (check_spec, remembered).
    bad = SamplingParams(structured_outputs=StructuredOutputs(regex="(ab"))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"(?s)^structured_outputs: invalid regex.*unclosed"):
            check_params(bad, 100)
    good = SamplingParams(structured_outputs=StructuredOutputs(choice=["a", "b"]))
    assert check_params(good, 100) is good
    with pytest.raises(ValueError, match="must be a SamplingParams"):
        check_params({"max_tokens": 3}, 100)  # type: ignore[arg-type]
