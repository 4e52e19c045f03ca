"""How an embedding model turns hidden states into one vector, read from the files
sentence-transformers writes beside the weights (no torch):

- ``modules.json``: the pipeline; a ``Normalize`` module means unit-length vectors.
- ``1_Pooling/config.json`` (the Pooling module's folder): ``pooling_mode_cls_token``,
  ``pooling_mode_mean_tokens``, ``pooling_mode_lasttoken``.
- ``sentence_bert_config.json``: ``max_seq_length``, where sentence-transformers cuts inputs.

A model without these files pools as its architecture's usual way (BERT: CLS, normalized).
"""

from __future__ import annotations

import os

import msgspec

from aioengine.hub.model_info import read_json, read_modules

POOLING_MODES = ("cls", "mean", "last")

_MODE_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
              "pooling_mode_lasttoken": "last"}


class PoolingConfig(msgspec.Struct, frozen=True):
    mode: str
    """``cls`` (the first token's state), ``mean`` (over the input's tokens), ``last``."""
    normalize: bool
    """Scale each vector to unit length (cosine similarity is then a dot product)."""
    max_length: int | None
    """Tokens an input is cut to by default (sentence-transformers' ``max_seq_length``)."""


def read_pooling_config(model_path: str) -> PoolingConfig:
    """The model's pooling; ValueError naming the file for a config this engine cannot follow
    (max pooling, several modes at once, an unknown module)."""
    modules = read_modules(model_path)
    mode, normalize = "cls", True  # BERT's own pooler input, as most encoder embedders use
    if modules is not None:
        normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
        pooling = next((m for m in modules if m.get("type", "").endswith(".Pooling")), None)
        if pooling is not None:
            path = os.path.join(model_path, pooling.get("path", ""), "config.json")
            mode = _pooling_mode(path, read_json(path) or {})
    bert = read_json(os.path.join(model_path, "sentence_bert_config.json")) or {}
    max_length = bert.get("max_seq_length")
    return PoolingConfig(mode, normalize, max_length if isinstance(max_length, int) else None)


def _pooling_mode(path: str, config: dict) -> str:
    on = [key for key, value in config.items() if key.startswith("pooling_mode_") and value]
    unknown = [key for key in on if key not in _MODE_KEYS]
    if unknown or len(on) != 1:
        raise ValueError(f"{path}: pooling {on or 'none'} is not supported (one of "
                         f"{sorted(_MODE_KEYS)} must be true, the others false)")
    return _MODE_KEYS[on[0]]
