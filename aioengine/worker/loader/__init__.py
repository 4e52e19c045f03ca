"""Build a model and fill its (tensor-parallel) parameters from a local Hugging Face directory
(safetensors, single file or sharded) or with seeded random weights (``load_format="dummy"``).
"""

from aioengine.worker.loader.devices import resolve_device, resolve_dtype
from aioengine.worker.loader.load import load_hf_config, load_model

__all__ = ["load_hf_config", "load_model", "resolve_device", "resolve_dtype"]
