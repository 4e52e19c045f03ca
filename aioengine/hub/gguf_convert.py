"""Write the Hugging Face side files of a GGUF model: ``python -m aioengine.hub.gguf_convert
FILE.gguf OUT_DIR``.

Run once per file, in a child interpreter (``gguf_model.gguf_model_dir`` starts it), because
transformers' GGUF readers import torch and the host must not. It writes ``config.json``,
``generation_config.json``, ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat
template) from the file's metadata, using transformers' own metadata mapping and tokenizer
converters, so the config and tokenizer are exactly those transformers builds from the same
file (the correctness oracle). The weights stay in the GGUF file: the workers read them from
there (``aioengine.worker.loader.gguf_weights``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from aioengine.hub.gguf_families import ARCHITECTURES, OWN_BASE, base_config, family_config
from aioengine.hub.gguf_types import SUPPORTED_TYPES, unsupported_types


def write(path: str, out_dir: str) -> None:
    import gguf
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    reader = gguf.GGUFReader(path)
    arch_field = reader.fields.get("general.architecture")
    arch = arch_field.contents() if arch_field is not None else None
    if arch not in ARCHITECTURES:  # before transformers, whose errors say less
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: "
                         f"{sorted(ARCHITECTURES)}")
    bad = unsupported_types(t.tensor_type.name for t in reader.tensors)
    if bad:
        raise ValueError(f"tensor type(s) {bad} are not supported; supported: "
                         f"{list(SUPPORTED_TYPES)}")

    def field(key: str) -> Any:
        found = reader.fields.get(key)
        return None if found is None else found.contents()

    base = (base_config(arch, field) if arch in OWN_BASE
            else load_gguf_checkpoint(path, return_tensors=False)["config"])
    config = family_config(arch, field, {t.name: t for t in reader.tensors}, base)
    architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(path)
    fast, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    vocab = fast.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    bos_id = tokenizer_dict.get("bos_token_id")
    if tokenizer_config.get("add_bos_token") and isinstance(bos_id, int) and bos_id in by_id:
        add_bos(fast, by_id[bos_id], bos_id)
    fast.save(os.path.join(out_dir, "tokenizer.json"))
    tok_config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "clean_up_tokenization_spaces": False,
                                  "model_max_length": config.get("max_position_embeddings")}
    for key in ("bos", "eos", "unk", "pad"):
        token_id = tokenizer_dict.get(f"{key}_token_id")
        if isinstance(token_id, int) and token_id in by_id:
            tok_config[f"{key}_token"] = by_id[token_id]
    for key in ("chat_template", "add_bos_token", "add_eos_token"):
        if key in tokenizer_config:
            tok_config[key] = tokenizer_config[key]
    _dump(out_dir, "tokenizer_config.json", tok_config)
    generation: dict[str, Any] = {k: config[k] for k in ("bos_token_id", "pad_token_id")
                                  if isinstance(config.get(k), int)}
    generation["eos_token_id"] = end_ids(reader, config)
    _dump(out_dir, "generation_config.json", generation)
    _dump(out_dir, "config.json", config)


def add_bos(fast: Any, bos: str, bos_id: int) -> None:
    """A file that says ``add_bos_token``: encoding a prompt prepends BOS, as llama.cpp does
    (and transformers' tokenizer from the file). The engine encodes with ``tokenizers`` alone,
    so the rule goes into tokenizer.json itself; chat prompts are encoded without special
    tokens (their template writes BOS)."""
    from tokenizers import processors

    template = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                             special_tokens=[(bos, bos_id)])
    existing = fast.post_processor
    fast.post_processor = (template if existing is None
                           else processors.Sequence([existing, template]))


def end_ids(reader: Any, config: dict[str, Any]) -> list[int]:
    """eos plus the end-of-turn / end-of-message tokens GGUF files name separately (Llama 3's
    ``<|eot_id|>``): a chat reply ends at any of them, as llama.cpp stops on them."""
    ids = [config["eos_token_id"]] if isinstance(config.get("eos_token_id"), int) else []
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        field = reader.fields.get(key)
        if field is not None:
            value = int(field.contents())
            if value not in ids:
                ids.append(value)
    return ids


def _dump(out_dir: str, name: str, data: dict[str, Any]) -> None:
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m aioengine.hub.gguf_convert FILE.gguf OUT_DIR", file=sys.stderr)
        return 2
    try:
        write(argv[0], argv[1])
    except (ValueError, KeyError, OSError) as exc:  # the parent shows this line as the cause
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
