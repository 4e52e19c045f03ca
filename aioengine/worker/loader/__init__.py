"""Build a model and fill its (tensor-parallel) parameters from a local Hugging Face directory
(safetensors, single file or sharded) or with seeded random weights (``load_format="dummy"``).
The config is read from ``config.json`` without transformers (``read_model_spec``).
"""

from aioengine.worker.loader.devices import resolve_device, resolve_dtype
from aioengine.worker.loader.load import load_model, read_model_spec

__all__ = ["load_model", "read_model_spec", "resolve_device", "resolve_dtype"]
