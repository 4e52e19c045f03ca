"""The real model's oracle: transformers' greedy tokens on the same GGUF file (the model, its
files and its shared server are in tests/smollm2.py)."""

from __future__ import annotations

import functools
import os

import pytest

NEW_TOKENS = 64


# Module scope, as in tests/server: the HTTP tests of the served model run under asyncio.
@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def chat_prompt(question: str) -> str:
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            f"Hugging Face<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


PROMPTS = [
    chat_prompt("What is the capital of France?"),
    chat_prompt("Write a haiku about the sea."),
    "Once upon a time",
    "def fibonacci(n):",
]


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_file: str):
    """transformers' model and tokenizer read from the same GGUF file (dequantized, fp32).

    transformers parses the file three times (tokenizer, config, weights) at ~5 s each over
    SmolLM2's 49k-token vocabulary, and rebuilds gguf's tensor-name map (a pure function of
    the architecture and layer count) for each of the model's ~400 submodules at ~30 ms each:
    the reader (read-only, memory-mapped) and the map are memoized while it loads, the same
    file read by the same transformers code, ~28 s -> ~8 s on the 2-core box."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(smollm2_file)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                     dtype=torch.float32)
    return model.eval(), tok


@pytest.fixture(scope="session")
def hf_greedy(hf_smollm2) -> dict[str, list[int]]:
    """Prompt -> transformers' greedy continuation (up to NEW_TOKENS, stopping at eos)."""
    import torch

    model, tok = hf_smollm2
    out: dict[str, list[int]] = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=model.config.eos_token_id, pad_token_id=2)
            out[prompt] = gen[0, ids.shape[1]:].tolist()
    return out
