"""Facts the host needs about a model directory, read from its JSON files (no torch, no
transformers): token ids that end generation, context length, vocab size, chat template."""

from __future__ import annotations

import json
import os
from typing import Any

import msgspec

ENCODER_ARCHITECTURES = ("BertModel",)
"""Bidirectional encoders the engine runs as embedding models (``aioengine.hub.pooling``)."""
CLASSIFIER_ARCHITECTURES = ("BertForSequenceClassification",)
"""Encoders with a classification head, run as rerankers (cross-encoders): one score per text
pair."""


class ModelInfo(msgspec.Struct, frozen=True):
    model_path: str
    architectures: list[str]
    vocab_size: int
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_ids: list[int]  # any of these ends generation (generation_config wins)
    chat_template: str | None
    task: str = "generate"  # "embed" for an encoder, "score" for a reranker (model_task)


def read_json_file(path: str) -> Any:
    """A JSON file's contents; None when the file is absent; ValueError naming the file when it
    is not JSON."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"malformed JSON in {path}: {exc}") from exc


def read_modules(model_path: str) -> list[dict[str, Any]] | None:
    """sentence-transformers' ``modules.json`` (its pipeline), None when absent."""
    path = os.path.join(model_path, "modules.json")
    modules = read_json_file(path)
    if modules is not None and (not isinstance(modules, list)
                                or not all(isinstance(m, dict) for m in modules)):
        raise ValueError(f"malformed {path}: expected a list of module objects")
    return modules


def read_json(path: str) -> dict[str, Any] | None:
    """A JSON object file's contents; None when the file is absent; ValueError naming the file
    when it is not a JSON object."""
    data = read_json_file(path)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"malformed {path}: expected a JSON object, got {type(data).__name__}")
    return data


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def read_chat_template(tokenizer_dir: str) -> str | None:
    """From ``chat_template.jinja`` (transformers 5 layout) or ``tokenizer_config.json``."""
    jinja = os.path.join(tokenizer_dir, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    config = read_json(os.path.join(tokenizer_dir, "tokenizer_config.json")) or {}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def model_task(architectures: list[str], model_path: str = "") -> str:
    """``embed`` for an encoder, or a decoder shipped as a sentence-transformers embedder (its
    ``modules.json`` has a Pooling module: Qwen3-Embedding and the like); ``score`` for an
    encoder with a classifier; else ``generate``."""
    if any(a in CLASSIFIER_ARCHITECTURES for a in architectures):
        return "score"
    if any(a in ENCODER_ARCHITECTURES for a in architectures):
        return "embed"
    modules = read_modules(model_path) if model_path else None
    pools = any(str(m.get("type", "")).endswith(".Pooling") for m in modules or [])
    return "embed" if pools else "generate"


def read_model_info(model_path: str, tokenizer_path: str | None = None) -> ModelInfo:
    """Raises FileNotFoundError / ValueError naming the file for a missing or malformed dir."""
    config_path = os.path.join(model_path, "config.json")
    config = read_json(config_path)
    if config is None:
        raise FileNotFoundError(f"no config.json in model directory {model_path!r}")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key in ("vocab_size", "max_position_embeddings"):
        if not isinstance(text.get(key), int):
            raise ValueError(f"{config_path} has no integer {key!r}")
    gen = read_json(os.path.join(model_path, "generation_config.json")) or {}
    eos = _ids(gen.get("eos_token_id")) or _ids(text.get("eos_token_id"))
    bos = gen.get("bos_token_id", text.get("bos_token_id"))
    return ModelInfo(
        model_path=model_path,
        architectures=list(config.get("architectures") or []),
        vocab_size=text["vocab_size"],
        max_position_embeddings=text["max_position_embeddings"],
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=eos,
        chat_template=read_chat_template(tokenizer_path or model_path),
        task=model_task(list(config.get("architectures") or []), model_path),
    )
