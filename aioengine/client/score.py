"""Scoring requests on the host (a reranker: a cross-encoder reads a query and a document
together and answers how relevant the document is): the text pair checked and tokenized as
the model was trained (``[CLS] query [SEP] document [SEP]``, token type 1 on the second text,
cut longest-first to the model's length), and the classifier's logit turned into a score."""

from __future__ import annotations

import math
from dataclasses import dataclass

from aioengine.client.outputs import RequestMetrics
from aioengine.client.tokenizer import Tokenizer
from aioengine.hub.model_info import read_json


@dataclass(slots=True)
class ScoreOutput:
    """One text pair's relevance (``AsyncMPClient.score``)."""

    request_id: str
    score: float
    """The classifier's logit through the model's activation (a sigmoid: 0 to 1)."""
    prompt_token_ids: list[int]
    """The pair as the model saw it (after truncation)."""
    metrics: RequestMetrics


@dataclass(slots=True)
class RerankResult:
    """One document of ``AsyncMPClient.rerank``, in order of relevance."""

    index: int
    """Its position in the documents given."""
    relevance_score: float
    document: str


@dataclass(frozen=True, slots=True)
class ScoreModel:
    max_model_len: int
    sigmoid: bool
    """Apply a sigmoid to the logit: sentence-transformers' CrossEncoder default for one
    label, unless the config names another activation."""

    @classmethod
    def read(cls, model_path: str, max_model_len: int) -> ScoreModel:
        """ValueError for a classifier with more than one label (not a reranker)."""
        config = read_json(f"{model_path}/config.json") or {}
        labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
        if labels != 1:
            raise ValueError(f"the model has {labels} labels: a reranker scores with one "
                             "(num_labels=1)")
        st = config.get("sentence_transformers") or {}
        activation = str(st.get("activation_fn") or "Sigmoid")
        return cls(max_model_len, activation.endswith("Sigmoid"))

    def score(self, logits: list[float]) -> float:
        x = logits[0]
        return 1.0 / (1.0 + math.exp(-x)) if self.sigmoid else x


def pair_token_ids(tokenizer: Tokenizer, text_1: str, text_2: str, model: ScoreModel,
                   truncate: bool | int = True) -> tuple[list[int], int]:
    """The pair's token ids and where the second text starts. ``truncate``: True cuts at the
    model's length (longest text first, as transformers does), an int at that many tokens,
    False refuses a longer pair."""
    for name, text in (("text_1", text_1), ("text_2", text_2)):
        if not isinstance(text, str):
            raise ValueError(f"{name} must be a string, got {type(text).__name__}")
        if not text:
            raise ValueError(f"{name} is an empty string: there is nothing to score")
    limit = model.max_model_len if truncate is True or truncate is False else truncate
    if isinstance(limit, bool) or not isinstance(limit, int) \
            or not 3 <= limit <= model.max_model_len:
        raise ValueError(f"truncate must be a boolean or a token count in [3, "
                         f"{model.max_model_len}], got {truncate!r}")
    ids, types = tokenizer.encode_pair(text_1, text_2, None if truncate is False else limit)
    if len(ids) > limit:
        raise ValueError(f"the pair has {len(ids)} tokens, more than the model's {limit} "
                         "(truncation is off)")
    return ids, types.index(1) if 1 in types else 0
