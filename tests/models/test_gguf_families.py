"""The families beyond Llama/Qwen2/Qwen3 from GGUF files that llama.cpp's own converter writes
(tests/models/llama_cpp_convert.py): a small random HF model saved as a directory, converted to
F32 GGUF; our greedy tokens from the GGUF equal transformers' from the directory (same
weights), and the tokenizer rebuilt from the file encodes as the directory's does.

Each test model carries the built-in tiny model's tokenizer (a ~1.8k-token byte-level BPE: the
vocabulary stays small, so the files stay fast to read) and a vocab_size equal to it (Gemma's
converter drops embedding rows past the tokenizer)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer

from aioengine import LLM, EngineConfig, SamplingParams
from aioengine.hub import resolve_model
from tests.models.llama_cpp_convert import convert, unpack_converter
from tests.worker.hf_models import make_hf_model

NEW_TOKENS = 12
TEXT = "Once upon a time, the river"

# variant of tests/worker/hf_models.py -> (overrides, what the case covers)
CASES: dict[str, dict[str, Any]] = {
    # llama.cpp runs a Gemma 3 file on its fixed layer pattern (5 local : 1 global), local RoPE
    # base and query scale 1/sqrt(head_dim) when the file gives none (the converter writes
    # none): 7 layers are local x5, global, local; a window of 4 keys, far shorter than the
    # prompts; local RoPE base 100 (written as freq_base_swa).
    "gemma3": dict(num_hidden_layers=7, sliding_window=4, sliding_window_pattern=6,
                   query_pre_attn_scalar=16, rope_local_base_freq=100.0),
    # 8 experts, top 3, renormalised, every layer sparse (llama.cpp has no dense layers here).
    "qwen3-moe": dict(mlp_only_layers=[]),
    # Fused qkv and gate/up, 3/4 of each head rotated, longrope factors (stored as tensors).
    "phi3": {},
    # Mixtral is written as a `llama` file with stacked experts and permuted q/k rows.
    "mixtral": {},
    # SmolLM3: llama.cpp skips rotary on every 4th layer (its fixed step): layer 3 of 4 NoPE.
    "smollm3": dict(num_hidden_layers=4, no_rope_layer_interval=4),
}


@pytest.fixture(scope="module")
def converter(tmp_path_factory: pytest.TempPathFactory) -> str:
    return unpack_converter(str(tmp_path_factory.mktemp("llama-cpp-convert")))


def _tokenizer_dir() -> str:
    return resolve_model("tiny").model_path


def _vocab() -> int:
    tok = Tokenizer.from_file(os.path.join(_tokenizer_dir(), "tokenizer.json"))
    return tok.get_vocab_size(with_added_tokens=True)


def _hf_dir(variant: str, path: str, **overrides: Any) -> Any:
    """The random HF model saved at ``path`` with the tiny tokenizer beside it."""
    hf = make_hf_model(variant, path, seed=3, vocab_size=_vocab(), **overrides)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(_tokenizer_dir(), name), path)
    if variant != "phi3":
        return hf
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    # Phi-3's converter reads a byte-level BPE tokenizer only when named so (as Phi-4's).
    config["tokenizer_class"] = "GPT2Tokenizer"
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return hf


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, _vocab(), (n,), generator=gen).tolist() for n in (5, 13, 21)]


def _greedy(path: str, prompts: list[Any], quantization: str) -> list[Any]:
    with LLM(EngineConfig(model=path, max_model_len=128, num_kv_blocks=64,
                          quantization=quantization)) as llm:
        return llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0,
                                                    ignore_eos=True), use_tqdm=False)


def _hf_greedy(hf: Any, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("variant", list(CASES))
def test_greedy_from_llama_cpp_gguf_equals_transformers(tmp_path, converter: str,
                                                        variant: str) -> None:
    from transformers import AutoTokenizer

    hf_dir, gguf_path = str(tmp_path / "hf"), str(tmp_path / f"{variant}.gguf")
    hf = _hf_dir(variant, hf_dir, **CASES[variant])
    convert(converter, hf_dir, gguf_path)
    prompts = _prompts()
    want = [_hf_greedy(hf, p) for p in prompts]
    assert all(len(set(w)) > 2 for w in want)  # the random model's output depends on context
    text_ids = AutoTokenizer.from_pretrained(hf_dir)(TEXT).input_ids
    outs = _greedy(gguf_path, [*prompts, TEXT], "none")
    assert [list(o.token_ids) for o in outs[:3]] == want
    assert list(outs[3].prompt_token_ids) == text_ids  # the tokenizer rebuilt from the file
    assert list(outs[3].token_ids) == _hf_greedy(hf, text_ids)


@pytest.mark.parametrize("variant", ["phi3", "qwen3-moe"])
def test_q8_0_file_kept_quantized_decodes_as_dequantized(tmp_path, converter: str,
                                                        variant: str) -> None:
    """The converter's Q8_0 file run as the default does (``quantization="auto"``: the blocks
    kept, our CPU kernels) gives the greedy tokens of the same file dequantized: Phi-3's fused
    qkv / gate-up blocks are kept; Qwen3-MoE's attention blocks are kept and its stacked expert
    blocks dequantized slab by slab at load (experts are not kept quantized yet)."""
    hf_dir, gguf_path = str(tmp_path / "hf"), str(tmp_path / f"{variant}.q8_0.gguf")
    _hf_dir(variant, hf_dir, **CASES[variant])
    convert(converter, hf_dir, gguf_path, "q8_0")
    prompts = _prompts()
    dequantized = [list(o.token_ids) for o in _greedy(gguf_path, prompts, "none")]
    assert [list(o.token_ids) for o in _greedy(gguf_path, prompts, "auto")] == dequantized
