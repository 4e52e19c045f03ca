"""Paged attention over a block-structured KV cache, for varlen batches of prefill chunks and
decode tokens. ``build_attention_metadata`` once per step; ``paged_attention`` in every layer."""

from aioengine.worker.attention.metadata import (
    AttentionMetadata,
    DecodeBucket,
    DecodeGroup,
    PrefillGroup,
    build_attention_metadata,
)
from aioengine.worker.attention.paged import paged_attention

__all__ = [
    "AttentionMetadata",
    "DecodeBucket",
    "DecodeGroup",
    "PrefillGroup",
    "build_attention_metadata",
    "paged_attention",
]
