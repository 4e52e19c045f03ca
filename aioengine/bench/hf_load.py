"""transformers' model on the same weights the engine serves (the bench's baselines)."""

from __future__ import annotations

import os
from typing import Any


def hf_model(resolved: Any, dtype: Any) -> Any:
    """``AutoModelForCausalLM`` for a ``ResolvedModel``: random weights of the same shapes for
    a dummy preset, the GGUF file dequantized by transformers, or the directory's weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from aioengine.hub.gguf_model import gguf_file_of

    if resolved.load_format_hint == "dummy":
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(resolved.model_path), dtype=dtype)
    gguf_file = gguf_file_of(resolved.model_path)
    if gguf_file is not None:
        folder, name = os.path.split(gguf_file)
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(resolved.model_path, dtype=dtype)
