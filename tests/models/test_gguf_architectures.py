"""GGUF files of each supported architecture and several tensor types, written the way
llama.cpp's converter writes them: our engine's greedy tokens equal transformers' on the same
file (Llama's permuted q/k rows, Qwen2's biases and untied head, Qwen3's q/k norms and a
head_dim that differs from hidden/heads)."""

from __future__ import annotations

import os

import gguf
import pytest
import torch

from aioengine import LLM, EngineConfig, SamplingParams
from tests.models.gguf_files import hf_tensors, write_gguf

Q = gguf.GGMLQuantizationType
PROMPT = [504, 3575, 282, 4649, 314]
CASES = [("llama", Q.Q8_0, True), ("qwen2", Q.F16, False), ("qwen3", Q.Q4_0, True),
         ("llama", Q.Q5_1, False)]


@pytest.mark.parametrize(("arch", "qtype", "tie"), CASES,
                         ids=[f"{a}-{q.name}-{'tied' if t else 'untied'}" for a, q, t in CASES])
def test_greedy_equals_transformers(tmp_path, smollm2_file: str, arch: str, qtype: Q,
                                    tie: bool) -> None:
    from transformers import AutoModelForCausalLM

    path = str(tmp_path / f"{arch}.gguf")
    write_gguf(path, arch, hf_tensors(arch, tie), smollm2_file, qtype)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32)
    with torch.inference_mode():
        want = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert len(set(want)) > 3  # the random model's output depends on its context
    # transformers dequantizes the file: so do we ("none"; kept blocks: tests/worker/quant)
    with LLM(EngineConfig(model=path, max_model_len=256, num_kv_blocks=64,
                          quantization="none")) as llm:
        got = llm.generate([PROMPT], SamplingParams(max_tokens=16, temperature=0,
                                                    ignore_eos=True), use_tqdm=False)[0]
    assert list(got.token_ids) == want
