"""Quantized weights under tensor parallelism: two spawned gloo ranks holding Q8_0 / Q4_0 / Q5_0
shards (rows split for column-parallel layers, every row cut at a block boundary for
row-parallel ones, the vocab split for the head) give the logits of one rank holding the whole
quantized weights. Blocks are independent along a row, so both hold the same blocks: only the
order of float sums differs (and with it, rarely, an activation's 16-bit rounding)."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.worker.quant.tp_child import MODES, every_mode_logits, quantized_logits
from tests.worker.tp_child import tp2_logits

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

# intermediate 128: the down projection's 64 inputs per rank are two 32-value blocks
VARIANTS = [("llama", {"intermediate_size": 128}),
            ("qwen2", {"num_key_value_heads": 2, "vocab_size": 255, "intermediate_size": 128})]


@pytest.fixture(scope="module")
def tp2_every_mode(tmp_path_factory: pytest.TempPathFactory
                   ) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """Rank 0's logits of every mode on each variant, from one pair of spawned gloo ranks for
    the module (spawning, importing torch and joining the group cost seconds a pair)."""
    return tp2_logits(tmp_path_factory.mktemp("tp"), VARIANTS, every_mode_logits)


@pytest.mark.parametrize("mode", MODES)
def test_tp2_quantized_matches_tp1_quantized(tp2_every_mode, mode):
    for model_dir, every in tp2_every_mode:
        tp2 = {key.split(".", 1)[1]: value for key, value in every.items()
               if key.startswith(mode + ".")}
        ref = quantized_logits(model_dir, 0, 1, mode)
        assert sorted(tp2) == sorted(ref)
        for key, want in ref.items():
            # 5e-4: the ranks' float sums differ in order, and a hidden state that moves by an
            # ulp can round to the neighbouring 16-bit activation (measured max 1.6e-4)
            torch.testing.assert_close(tp2[key], want, atol=5e-4, rtol=1e-4)
