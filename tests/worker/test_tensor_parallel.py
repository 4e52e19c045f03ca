"""Tensor parallelism over gloo: two spawned ranks give the logits of one rank (real weights
and seeded dummy weights), for an untied GQA Llama and a tied Qwen2 with biases and a vocab
that does not split evenly."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from safetensors.torch import load_file

from aioengine.worker.parallel import default_init_addr, find_free_port
from aioengine.worker.parallel.distributed import _parse_addr
from tests.worker.hf_models import make_hf_model
from tests.worker.tp_child import all_logits, run_rank

VARIANTS = [("llama", {}), ("qwen2", {"num_key_value_heads": 2, "vocab_size": 255}),
            ("qwen3-moe", {}), ("phi3", {"num_key_value_heads": 2}), ("mistral", {}),
            ("gemma3", {})]


def test_tp2_matches_tp1(tmp_path):
    dirs, outs = [], []
    for variant, overrides in VARIANTS:
        dirs.append(str(tmp_path / variant))
        outs.append(str(tmp_path / f"{variant}-tp2.safetensors"))
        make_hf_model(variant, dirs[-1], seed=11, **overrides)
    ctx = mp.get_context("spawn")
    addr = default_init_addr()
    procs = [ctx.Process(target=run_rank, args=(r, 2, addr, dirs, outs)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=240)
        assert [p.exitcode for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    for (variant, overrides), model_dir, out in zip(VARIANTS, dirs, outs, strict=True):
        tp2 = load_file(out)
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
