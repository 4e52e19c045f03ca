"""Model resolution for the host and the workers, without torch.

``resolve_model("tiny" | preset | directory)`` gives a ``ResolvedModel``; built-in models are
written on first use under ``aioengine.config.cache_dir()`` in the Hugging Face layout, so they
go through the same loading code as any local model. ``read_model_info`` reads the facts the
host needs (eos/bos ids, context length, vocab size, chat template) from a model directory.
"""

from aioengine.hub.model_info import ModelInfo, read_model_info
from aioengine.hub.presets import PRESETS
from aioengine.hub.resolve import (
    BUILTIN_MODELS,
    ResolvedModel,
    resolve_model,
    served_model_name,
)
from aioengine.hub.tiny import TINY_VERSION, ensure_tiny

__all__ = [
    "BUILTIN_MODELS",
    "PRESETS",
    "TINY_VERSION",
    "ModelInfo",
    "ResolvedModel",
    "ensure_tiny",
    "read_model_info",
    "resolve_model",
    "served_model_name",
]
