"""Tensor parallelism over gloo: two spawned ranks give the logits of one rank (real weights
and seeded dummy weights), for an untied GQA Llama and a tied Qwen2 with biases and a vocab
that does not split evenly."""

from __future__ import annotations

import pytest
import torch

from aioengine.worker.parallel import default_init_addr, find_free_port
from aioengine.worker.parallel.distributed import _parse_addr
from tests.worker.tp_child import all_logits, tp2_logits

VARIANTS = [("llama", {}), ("qwen2", {"num_key_value_heads": 2, "vocab_size": 255}),
            ("qwen3-moe", {}), ("phi3", {"num_key_value_heads": 2}), ("mistral", {}),
            ("gemma3", {}), ("smollm3", {})]


def test_tp2_matches_tp1(tmp_path):
    for (variant, overrides), (model_dir, tp2) in zip(
            VARIANTS, tp2_logits(tmp_path, VARIANTS, all_logits), strict=True):
        ref = all_logits(model_dir, 0, 1)
        assert sorted(tp2) == sorted(ref)
        vocab = overrides.get("vocab_size", 256)
        for key, want in ref.items():
            assert tp2[key].shape == want.shape == (want.shape[0], vocab)
            torch.testing.assert_close(tp2[key], want, atol=1e-4, rtol=1e-4,
                                       msg=lambda m, k=key, v=variant: f"{v} {k}: {m}")


def test_addresses():
    port = find_free_port()
    assert 0 < port < 65536
    host, port = _parse_addr(default_init_addr())
    assert host == "127.0.0.1" and port > 0
    for bad in ("localhost", "host:", ":123", "h:99999", "h:abc"):
        with pytest.raises(ValueError, match="init_addr must be 'host:port'"):
            _parse_addr(bad)
