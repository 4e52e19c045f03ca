"""The tiny model's files: written once under concurrency, deterministic, torch-free, and a
tokenizer that round-trips any text and renders the chat template."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import jinja2
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from aioengine.hub import TINY_VERSION, read_model_info, resolve_model
from aioengine.hub.tiny import write_tiny
from tests.hub.hub_child import resolve_tiny


def test_an_unwritable_cache_names_the_setting_to_change(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("AIOENGINE_CACHE", str(not_a_dir))
    with pytest.raises(OSError, match="cannot write the built-in model 'tiny-v.*' under "
                       f"{not_a_dir}/models .*set AIOENGINE_CACHE to a writable directory"):
        resolve_model("tiny")


def test_concurrent_first_use_writes_one_complete_copy(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("AIOENGINE_CACHE", str(cache))  # inherited by the spawned children
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(3)
    outs = [str(tmp_path / f"out{i}.json") for i in range(3)]
    procs = [ctx.Process(target=resolve_tiny, args=(barrier, out)) for out in outs]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=240)
        assert [p.exitcode for p in procs] == [0, 0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
    expected = str(cache / "models" / f"tiny-v{TINY_VERSION}")
    assert {r["path"] for r in results} == {expected}
    assert not any(r["torch_imported"] for r in results)  # the host side stays torch-free
    assert os.listdir(cache / "models") == [f"tiny-v{TINY_VERSION}"]  # no temp dirs left
    assert sorted(os.listdir(expected)) == [
        "config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json"]
    assert read_model_info(expected).vocab_size == results[0]["vocab"]


def test_build_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_tiny(str(a))
    write_tiny(str(b))
    for name in os.listdir(a):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture(scope="module")
def tiny():
    resolved = resolve_model("tiny")
    return resolved, Tokenizer.from_file(os.path.join(resolved.tokenizer_path,
                                                      "tokenizer.json"))


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_tokenizer_round_trips_any_text(tiny, text):
    tok = tiny[1]
    # Text that spells a special token ("<|pad|>") encodes as that token, as in every Hugging
    # Face tokenizer; such text is not plain text to round-trip.
    assume(not any(t.content in text for t in tok.get_added_tokens_decoder().values()))
    ids = tok.encode(text).ids
    assert ids[0] == 0  # <|bos|> prepended
    assert tok.decode(ids, skip_special_tokens=True) == text
    plain = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(plain, skip_special_tokens=False) == text


def test_model_info_and_special_tokens(tiny):
    resolved, tok = tiny
    info = read_model_info(resolved.model_path)
    assert info.vocab_size == tok.get_vocab_size()
    assert info.max_position_embeddings >= 2048
    assert info.bos_token_id == tok.token_to_id("<|bos|>") == 0
    assert info.eos_token_ids == [tok.token_to_id("<|eos|>"), tok.token_to_id("<|im_end|>")]
    assert info.architectures == ["LlamaForCausalLM"]


def test_chat_template_renders(tiny):
    resolved, tok = tiny
    template = read_model_info(resolved.model_path).chat_template
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi there"}]
    text = env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token="<|bos|>")
    assert text == ("<|bos|><|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids[:2] == [tok.token_to_id("<|bos|>"), tok.token_to_id("<|im_start|>")]
    no_prompt = env.from_string(template).render(messages=messages[1:],
                                                 add_generation_prompt=False,
                                                 bos_token="<|bos|>")
    assert no_prompt.endswith("Hi there<|im_end|>\n")


def test_transformers_reads_the_tokenizer(tiny):
    from transformers import AutoTokenizer

    resolved, tok = tiny
    hf_tok = AutoTokenizer.from_pretrained(resolved.tokenizer_path)
    text = "Hello, world! Größe 你好 🙂"
    assert hf_tok(text)["input_ids"] == tok.encode(text).ids
    chat = hf_tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                      add_generation_prompt=True)
    assert chat == "<|bos|><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
