"""Family-specific behaviour against transformers beyond the shared parity schedule
(tests/worker/test_model_parity.py): Phi-3 longrope past the original context."""

from __future__ import annotations

import torch

from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver
from tests.worker.hf_models import make_hf_model


def _hf_generate(hf, prompt: list[int], new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                          do_sample=False)
    return out[0, len(prompt):].tolist()


def _hf_cached_greedy(hf, prompt: list[int], new: int) -> list[int]:
    """Greedy decoding through transformers' forward with its KV cache kept throughout
    (``generate`` on Phi-3 instead drops the cache once, at the first token past the original
    context, and recomputes the whole sequence on the long factors)."""
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        for _ in range(new - 1):
            out = hf(torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values,
                     use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def test_phi3_longrope_switches_to_long_factors_past_original_context(tmp_path):
    """Original context 24: a 30-token prompt runs on the long factors from its first token, a
    10-token one stays short (both equal transformers' generate); a 20-token prompt switches
    at its 25th token, keeping the keys it cached on the short factors (equal to transformers'
    forward with its cache kept; see _hf_cached_greedy)."""
    hf = make_hf_model("phi3", str(tmp_path), seed=5, original_max_position_embeddings=24)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    ours, cfg = load_model(str(tmp_path), dtype="float32", device="cpu")
    assert ours.spec.rope.rope_type == "longrope" and ours.spec.rope.original_max_position == 24
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (30, 20, 10)]
    d = Driver(ours, cfg, block_size=4)
    for p in prompts:
        d.add(p)
    d.step([(i, len(p)) for i, p in enumerate(prompts)])
    d.decode_all(11)
    for i, (seq, prompt) in enumerate(zip(d.seqs, prompts, strict=True)):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        got = torch.stack([seq.logits[p] for p in range(len(prompt))])
        torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
        assert seq.tokens[len(prompt):] == _hf_cached_greedy(hf, prompt, 12), i
        if i != 1:
            assert seq.tokens[len(prompt):] == _hf_generate(hf, prompt, 12), i
    # The long factors matter: the 30-token prompt's logits on the short table differ.
    short = make_hf_model("phi3", str(tmp_path / "short"), seed=5)
    with torch.no_grad():
        other = short(torch.tensor([prompts[0]])).logits[0]
    assert not torch.allclose(other, torch.stack([d.seqs[0].logits[p] for p in range(30)]),
                              atol=1e-2)
