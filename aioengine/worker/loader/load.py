"""``load_model``: directory (or resolved built-in) -> (model with weights, its ``ModelSpec``).

The config is read from ``config.json`` directly (``read_model_spec``), never through
transformers: its import and ``AutoConfig`` cost seconds of CPU in every engine and worker.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from aioengine.hub import ResolvedModel, resolve_model
from aioengine.hub.gguf_model import gguf_file_of
from aioengine.hub.model_info import read_json
from aioengine.worker.loader.devices import resolve_device, resolve_dtype
from aioengine.worker.loader.gguf_weights import kernel_block_types, load_gguf, tensors_reader
from aioengine.worker.loader.weights import load_dummy, load_safetensors
from aioengine.worker.models import CausalLM, build_model
from aioengine.worker.models.spec import ModelSpec

logger = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


def read_model_spec(model_dir: str) -> ModelSpec:
    """The directory's ``config.json`` as a ``ModelSpec`` (FileNotFoundError / ValueError
    naming the directory or file when it is absent, malformed or unsupported)."""
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model directory {model_dir!r} does not exist")
    path = os.path.join(model_dir, "config.json")
    raw = read_json(path)
    if raw is None:
        raise FileNotFoundError(f"no config.json in model directory {model_dir!r}")
    return ModelSpec.from_config_dict(raw, source=path)


def load_model(path_or_resolved: str | ResolvedModel, *, dtype: str | torch.dtype = "auto",
               device: str | torch.device = "auto", load_format: str = "auto", tp_rank: int = 0,
               tp_size: int = 1, seed: int = 0,
               quantization: str | None = None,
               quant_activations: str = "int16", quant_x8: bool = True,
               quant_x8_prefill: bool = True) -> tuple[CausalLM, ModelSpec]:
    """Build the model for this rank and fill its weights; returns ``(model, spec)``.

    ``path_or_resolved``: a local Hugging Face directory, a GGUF file, a built-in name
    (``tiny``, a preset), or a ``ResolvedModel``. ``load_format``: ``auto`` (what the model
    resolved to), ``safetensors``, ``gguf`` (dequantized to ``dtype``), or ``dummy`` (random
    weights seeded by ``seed``). ``quantization``: keep linear weights quantized
    (``EngineConfig.quantization``, ``quant_activations``; CPU only; ``auto`` resolved by
    ``auto_quantization``; None or ``none``: float weights); ``quant_x8``,
    ``quant_x8_prefill``: their layout (``CpuKernelConfig``).
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    resolved = (path_or_resolved if isinstance(path_or_resolved, ResolvedModel)
                else resolve_model(path_or_resolved))
    if load_format == "auto":
        load_format = resolved.load_format_hint
    spec = read_model_spec(resolved.model_path)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, spec, dev)
    model = build_model(spec, dtype=torch_dtype, device=dev, tp_rank=tp_rank, tp_size=tp_size)
    gguf_file = gguf_file_of(resolved.model_path)
    if load_format == "gguf" and gguf_file is None:
        raise ValueError(f"load_format 'gguf' needs a GGUF file; {resolved.name!r} is not one")
    if load_format == "safetensors" and gguf_file is not None:
        raise ValueError(f"load_format 'safetensors' given for the GGUF file "
                         f"{gguf_file!r}: use 'auto' or 'gguf'")
    reader = (tensors_reader(gguf_file) if gguf_file is not None and load_format != "dummy"
              else None)
    if quantization == "auto":
        quantization = auto_quantization(reader, dev, torch_dtype)
    if quantization not in (None, "none"):
        if quantization == "gguf" and reader is None:
            raise ValueError(f"quantization 'gguf' keeps a GGUF file's blocks; {resolved.name!r} "
                             "is not loaded from one (name a block type, e.g. 'q8_0', to "
                             "quantize its weights at load)")
        from aioengine.worker.quant.model import quantize_model

        quantize_model(model, quantization, quant_activations, x8=quant_x8,
                       x8_prefill=quant_x8_prefill)
    if load_format == "dummy":
        load_dummy(model, seed)
    elif reader is not None:
        load_gguf(model, reader, quantization)
    else:
        load_safetensors(model, resolved.model_path)
    model.eval()
    logger.info("loaded %s (%s, %s, %s weights, rank %d/%d)", resolved.model_path, torch_dtype,
                dev, load_format, tp_rank, tp_size)
    return model, spec


def auto_quantization(reader: Any, device: torch.device, dtype: torch.dtype) -> str | None:
    """``quantization="auto"``: ``gguf`` (keep the blocks as stored) for a GGUF file with
    tensors in block types our CPU kernels compute, loaded on CPU in float32 (the kernels'
    activations); None (float weights) otherwise: a float-only file, another device or dtype,
    a safetensors checkpoint. Dequantizing a Q4_1 file made SmolLM2 decode at a third of the
    kept blocks' speed and hold 5x the weight memory."""
    if reader is None or device.type != "cpu" or dtype != torch.float32:
        return None
    kept = kernel_block_types(reader)
    if not kept:
        return None
    logger.info("quantization 'auto': keeping the GGUF file's %s blocks (quantization='none' "
                "dequantizes them)", "/".join(kept))
    return "gguf"
