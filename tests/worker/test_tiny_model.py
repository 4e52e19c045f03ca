"""The built-in tiny model through the real loader, against transformers on the same files."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from aioengine.hub import resolve_model
from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver


def test_tiny_loads_and_matches_transformers():
    resolved = resolve_model("tiny")
    ours, spec = load_model("tiny", dtype="float32", device="cpu")
    assert spec.family == "llama" and spec.max_position_embeddings >= 2048
    assert not spec.tie_word_embeddings and spec.num_kv_heads < spec.num_heads
    hf = AutoModelForCausalLM.from_pretrained(resolved.model_path, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(f"{resolved.tokenizer_path}/tokenizer.json")
    prompt = tok.encode("Once upon a time, the model").ids
    d = Driver(ours, spec, block_size=16)
    d.add(prompt)
    d.step([(0, len(prompt))])
    d.decode_all(24)
    seq = d.seqs[0]
    with torch.no_grad():
        ref = hf(torch.tensor([seq.tokens[:-1]])).logits[0]
    got = torch.stack([seq.logits[p] for p in range(len(seq.tokens) - 1)])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    generated = seq.tokens[len(prompt):]
    assert ref[len(prompt) - 1:].argmax(-1).tolist() == generated
    assert len(set(generated)) > 3, tok.decode(generated)  # greedy text is not one token
    assert tok.decode(generated).strip()  # real text, not ids outside the vocab
