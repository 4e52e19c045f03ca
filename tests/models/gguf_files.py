"""Write small GGUF files the way llama.cpp's converter lays them out (tensor names from the
gguf package's map, Llama's q/k rows permuted, blocks quantized by gguf.quants), with SmolLM2's
tokenizer metadata cut to its first VOCAB tokens, so architectures and tensor types without a
real file here are tested against transformers reading the same file."""

from __future__ import annotations

import functools
from typing import Any

import gguf
import numpy as np

# Small random models; the vocab is SmolLM2's first VOCAB tokens (its tokenizer, cut there, is
# copied into each file). The whole 49152 cost ~5 s per read of a file on the 2-core box, and each
# test reads its file 5-6 times (our converter 3, transformers 2-3): 20-30 s a test. SmolLM2's
# merge i builds token 252 + i, so its first VOCAB - 252 merges build exactly these tokens.
VOCAB = 5120
BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
# qwen3: head_dim != hidden / heads (128 is also what transformers assumes: its GGUF mapping
# for qwen3 does not read attention.key_length).
HEAD_DIM = {"llama": 16, "qwen2": 16, "qwen3": 128}


def hf_tensors(arch: str, tie: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random HF-named weights of the BASE shapes (std 0.2, so the output depends on the
    context; norms near 1)."""
    rng = np.random.default_rng(seed)
    h, i, d = BASE["hidden_size"], BASE["intermediate_size"], HEAD_DIM[arch]
    hq, hkv = BASE["num_attention_heads"], BASE["num_key_value_heads"]

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.2, shape).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + rng.normal(0.0, 0.1, n)).astype(np.float32)

    out = {"model.embed_tokens.weight": w(VOCAB, h), "model.norm.weight": norm(h)}
    if not tie:
        out["lm_head.weight"] = w(VOCAB, h)
    for n in range(BASE["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out |= {p + "input_layernorm.weight": norm(h),
                p + "post_attention_layernorm.weight": norm(h),
                p + "self_attn.q_proj.weight": w(hq * d, h),
                p + "self_attn.k_proj.weight": w(hkv * d, h),
                p + "self_attn.v_proj.weight": w(hkv * d, h),
                p + "self_attn.o_proj.weight": w(h, hq * d),
                p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                p + "mlp.down_proj.weight": w(h, i)}
        if arch == "qwen2":
            for name, rows in (("q", hq * d), ("k", hkv * d), ("v", hkv * d)):
                out[f"{p}self_attn.{name}_proj.bias"] = w(rows)
        if arch == "qwen3":
            out[p + "self_attn.q_norm.weight"] = norm(d)
            out[p + "self_attn.k_norm.weight"] = norm(d)
    return out


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``LlamaModel.permute``."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


@functools.lru_cache(maxsize=2)
def _tokenizer_fields(path: str) -> dict[str, Any]:
    """The tokenizer metadata of the GGUF file at ``path`` cut to its first VOCAB tokens (and
    the merges among them), read once per test process: ``GGUFReader`` takes ~4 s over
    SmolLM2's 49k tokens and merges, and every file written here copies them."""
    fields = gguf.GGUFReader(path).fields
    out = {key: field.contents() for key, field in fields.items()
           if key.startswith("tokenizer.")}
    tokens = out["tokenizer.ggml.tokens"][:VOCAB]
    kept = set(tokens)
    out["tokenizer.ggml.tokens"] = tokens
    out["tokenizer.ggml.token_type"] = out["tokenizer.ggml.token_type"][:VOCAB]
    out["tokenizer.ggml.merges"] = [m for m in out["tokenizer.ggml.merges"]
                                    if {*m.split(" ", 1), m.replace(" ", "", 1)} <= kept]
    assert len(out["tokenizer.ggml.merges"]) == VOCAB - 252  # SmolLM2's layout (above)
    return out


def _copy_tokenizer(writer: gguf.GGUFWriter, source: str) -> None:
    get = _tokenizer_fields(source).__getitem__
    writer.add_tokenizer_model(get("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(get("tokenizer.ggml.pre"))
    writer.add_token_list(get("tokenizer.ggml.tokens"))
    writer.add_token_types(get("tokenizer.ggml.token_type"))
    writer.add_token_merges(get("tokenizer.ggml.merges"))
    writer.add_bos_token_id(get("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(get("tokenizer.ggml.eos_token_id"))
    writer.add_unk_token_id(get("tokenizer.ggml.unknown_token_id"))
    writer.add_pad_token_id(get("tokenizer.ggml.padding_token_id"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(get("tokenizer.chat_template"))


def write_gguf(path: str, arch: str, tensors: dict[str, np.ndarray], tokenizer_from: str,
               qtype: gguf.GGMLQuantizationType, *, drop: tuple[str, ...] = (),
               raw: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None
               ) -> None:
    """``qtype`` for 2-D weights (norms and biases stay F32, as llama.cpp keeps them);
    ``drop``: GGUF names left out; ``raw``: extra tensors written as given."""
    arch_enum = {n: a for a, n in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(arch_enum, BASE["num_hidden_layers"])
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(BASE["num_hidden_layers"])
    writer.add_context_length(BASE["max_position_embeddings"])
    writer.add_embedding_length(BASE["hidden_size"])
    writer.add_feed_forward_length(BASE["intermediate_size"])
    writer.add_head_count(BASE["num_attention_heads"])
    writer.add_head_count_kv(BASE["num_key_value_heads"])
    writer.add_key_length(HEAD_DIM[arch])
    writer.add_value_length(HEAD_DIM[arch])
    writer.add_rope_dimension_count(HEAD_DIM[arch])
    writer.add_rope_freq_base(BASE["rope_theta"])
    writer.add_layer_norm_rms_eps(BASE["rms_norm_eps"])
    writer.add_vocab_size(VOCAB)
    _copy_tokenizer(writer, tokenizer_from)
    for hf_name, value in tensors.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        if name in drop:
            continue
        if arch == "llama" and ".attn_q." in name:
            value = _permute(value, BASE["num_attention_heads"])
        elif arch == "llama" and ".attn_k." in name:
            value = _permute(value, BASE["num_key_value_heads"])
        if value.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, value)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, value.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    for name, (data, raw_type) in (raw or {}).items():
        writer.add_tensor(name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
