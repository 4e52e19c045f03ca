"""Embedding requests on the host: an input (text or token ids) checked, tokenized and cut to
the model's length; the engine's pooled vector shortened (``dimensions``) where the model was
trained for it. Every bad input is a ``ValueError`` naming the field, raised before anything
is sent."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from aioengine.client.inputs import checked_token_ids
from aioengine.client.outputs import RequestMetrics
from aioengine.client.tokenizer import Tokenizer
from aioengine.hub.model_info import read_json
from aioengine.hub.pooling import PoolingConfig

EmbedInput = str | list[int]


@dataclass(slots=True)
class EmbeddingOutput:
    """One input's embedding (``AsyncMPClient.embed``)."""

    request_id: str
    embedding: list[float]
    """The pooled vector (unit length when the model normalizes)."""
    prompt_token_ids: list[int]
    """The input as the model saw it (after truncation)."""
    metrics: RequestMetrics


@dataclass(frozen=True, slots=True)
class EmbeddingModel:
    """What the host needs to prepare inputs and shape answers for one embedding model."""

    pooling: PoolingConfig
    max_model_len: int
    size: int
    """Values in the model's embedding (its hidden size)."""
    matryoshka: tuple[int, ...] | None
    """Lengths the model was trained to be cut to (empty: any), None: not cut at all."""

    @property
    def default_length(self) -> int:
        """Where inputs are cut unless the request says otherwise (sentence-transformers'
        ``max_seq_length``, else the model's context)."""
        return min(self.pooling.max_length or self.max_model_len, self.max_model_len)

    @classmethod
    def read(cls, model_path: str, pooling: PoolingConfig, max_model_len: int) -> EmbeddingModel:
        """``matryoshka_dimensions`` (or ``is_matryoshka``) from ``config.json`` or
        ``config_sentence_transformers.json``, as vLLM reads them."""
        dims: tuple[int, ...] | None = None
        configs = [read_json(f"{model_path}/{name}") or {}
                   for name in ("config.json", "config_sentence_transformers.json")]
        size = configs[0].get("hidden_size")
        if not isinstance(size, int):
            raise ValueError(f"{model_path}/config.json has no integer 'hidden_size'")
        for config in configs:
            listed = config.get("matryoshka_dimensions")
            if isinstance(listed, list) and all(isinstance(d, int) for d in listed):
                dims = tuple(listed)
            elif config.get("is_matryoshka") is True and dims is None:
                dims = ()
        return cls(pooling, max_model_len, size, dims)


def embedding_token_ids(tokenizer: Tokenizer, item: EmbedInput, model: EmbeddingModel,
                        truncate: bool | int = True) -> list[int]:
    """The token ids of one input. ``truncate``: True cuts at the model's default length,
    an int at that many tokens, False refuses a longer input."""
    limit = _limit(model, truncate)
    if isinstance(item, str):
        if not item:
            raise ValueError("input is an empty string: there is nothing to embed")
        ids = tokenizer.encode_truncated(item, limit if truncate is not False else None)
    elif isinstance(item, Sequence) and not isinstance(item, (bytes, bytearray)):
        ids = checked_token_ids(item, tokenizer.vocab_size, "input")
        if not ids:
            raise ValueError("input is an empty list of token ids: there is nothing to embed")
        if truncate is not False:
            ids = ids[:limit]
    else:
        raise ValueError(f"input must be a string or a list of token ids, got "
                         f"{type(item).__name__}")
    if len(ids) > limit:
        raise ValueError(f"input has {len(ids)} tokens, more than the model's {limit} "
                         "(truncation is off)")
    return ids


def _limit(model: EmbeddingModel, truncate: bool | int) -> int:
    if truncate is True or truncate is False:
        return model.default_length
    if not isinstance(truncate, int) or not 1 <= truncate <= model.max_model_len:
        raise ValueError(f"truncate must be a boolean or a token count in [1, "
                         f"{model.max_model_len}], got {truncate!r}")
    return truncate


def check_dimensions(dimensions: int | None, model: EmbeddingModel) -> None:
    """ValueError unless the model can give ``dimensions`` values: its full size, or a length
    it was trained to be cut to."""
    size = model.size
    if dimensions is None or dimensions == size:
        return
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) \
            or not 1 <= dimensions <= size:
        raise ValueError(f"dimensions must be an integer in [1, {size}], got {dimensions!r}")
    allowed = model.matryoshka
    if allowed is None:
        raise ValueError(f"dimensions cannot shorten this model's {size}-value embeddings: it "
                         "was not trained to be shortened (no matryoshka_dimensions in its "
                         "config)")
    if allowed and dimensions not in allowed:
        raise ValueError(f"dimensions must be one of {list(allowed)} for this model, got "
                         f"{dimensions}")


def shorten(vector: list[float], dimensions: int | None, model: EmbeddingModel) -> list[float]:
    """The first ``dimensions`` values (checked by ``check_dimensions``), scaled back to unit
    length when the model normalizes."""
    if dimensions is None or dimensions == len(vector):
        return vector
    cut = vector[:dimensions]
    if not model.pooling.normalize:
        return cut
    norm = math.sqrt(sum(v * v for v in cut)) or 1.0
    return [v / norm for v in cut]
