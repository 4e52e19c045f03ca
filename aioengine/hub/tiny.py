"""The built-in ``tiny`` model: a small Llama with seeded weights and its own tokenizer.

Written with numpy + ``safetensors.numpy`` (no torch in the host) in the Hugging Face layout,
so it loads through the real loader and transformers alike. The weights are random but not
structureless: the output head is set up from the corpus' bigram statistics, so greedy text
follows plausible token transitions (and sometimes ends with eos) instead of repeating one
token; the small random layers add context dependence.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from aioengine.hub.cache import ensure_dir
from aioengine.hub.corpus import DOCUMENTS
from aioengine.hub.tokenizer_build import (
    MAX_LENGTH,
    SPECIAL_TOKENS,
    build_tokenizer,
    write_tokenizer,
)

TINY_VERSION = 1
TINY_SEED = 1234
HIDDEN = 256
LAYERS = 4
HEADS = 8
KV_HEADS = 4
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 688
LAYER_STD = 0.02

if TYPE_CHECKING:  # numpy is imported only to write the model (a slow import)
    import numpy as np


def tiny_dir_name() -> str:
    return f"tiny-v{TINY_VERSION}"


def ensure_tiny() -> str:
    """The tiny model's directory, written on first use (safe under concurrency)."""
    return ensure_dir(tiny_dir_name(), write_tiny)


def tiny_config(vocab_size: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_LENGTH,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": SPECIAL_TOKENS.index("<|bos|>"),
        "eos_token_id": SPECIAL_TOKENS.index("<|eos|>"),
        "pad_token_id": SPECIAL_TOKENS.index("<|pad|>"),
        "torch_dtype": "float32",
    }


def _bigram_head(token_docs: list[list[int]], embed: np.ndarray) -> np.ndarray:
    """An LM head whose logits for a residual stream ~ normalised ``embed[a]`` approximate the
    centred bigram log-probabilities log P(b | a) of the corpus."""
    import numpy as np

    vocab, hidden = embed.shape
    counts = np.zeros((vocab, vocab), dtype=np.float64)
    for ids in token_docs:
        np.add.at(counts, (ids[:-1], ids[1:]), 1.0)
    logp = np.log((counts + 0.01) / (counts + 0.01).sum(axis=1, keepdims=True))
    centred = logp - logp.mean(axis=1, keepdims=True)  # unseen rows become all zeros
    unit = embed / np.sqrt((embed.astype(np.float64) ** 2).mean(axis=1, keepdims=True))
    return (centred.T @ unit / hidden).astype(np.float32)


def tiny_weights(vocab_size: int, token_docs: list[list[int]]) -> dict[str, np.ndarray]:
    import numpy as np

    rng = np.random.default_rng(TINY_SEED)

    def normal(*shape: int, std: float = LAYER_STD) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    embed = normal(vocab_size, HIDDEN, std=1.0)
    tensors = {"model.embed_tokens.weight": embed,
               "model.norm.weight": np.ones(HIDDEN, dtype=np.float32),
               "lm_head.weight": _bigram_head(token_docs, embed)}
    for i in range(LAYERS):
        pre = f"model.layers.{i}."
        tensors[pre + "input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        tensors[pre + "post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        tensors[pre + "self_attn.q_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
        tensors[pre + "self_attn.k_proj.weight"] = normal(KV_HEADS * HEAD_DIM, HIDDEN)
        tensors[pre + "self_attn.v_proj.weight"] = normal(KV_HEADS * HEAD_DIM, HIDDEN)
        tensors[pre + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM)
        tensors[pre + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[pre + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[pre + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
    return tensors


def write_tiny(out_dir: str) -> None:
    from safetensors.numpy import save_file

    tok = build_tokenizer()
    vocab_size = tok.get_vocab_size()
    eos = SPECIAL_TOKENS.index("<|eos|>")
    docs = [[*tok.encode(doc).ids, eos] for doc in DOCUMENTS]
    save_file(tiny_weights(vocab_size, docs), os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    config = tiny_config(vocab_size)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    generation = {"bos_token_id": config["bos_token_id"],
                  "eos_token_id": [eos, SPECIAL_TOKENS.index("<|im_end|>")],
                  "pad_token_id": config["pad_token_id"]}
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(generation, f, indent=2)
    write_tokenizer(tok, out_dir)
