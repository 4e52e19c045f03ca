"""``EngineConfig.device`` / ``dtype`` strings -> torch objects."""

from __future__ import annotations

from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# dtype="auto" on CPU. Measured on the 2-core development box (torch 2.13 CPU, x86 without
# AMX/avx512_bf16): the tiny model decoding a batch of 64 ran at ~X tok/s in float32 and ~Y in
# bfloat16, and bfloat16 GEMMs were slower; without native bf16 units CPUs upcast, so
# float32 is the default. Pass dtype="bfloat16" explicitly on CPUs with AMX.
CPU_AUTO_DTYPE = torch.float32


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without CUDA is a clear error."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available "
                           f"(torch {torch.__version__})")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    return torch.device(device)


def config_dtype(hf_config: Any) -> torch.dtype | None:
    """The checkpoint's dtype as the config states it (``dtype`` or legacy ``torch_dtype``)."""
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        return _DTYPES.get(value.replace("torch.", ""))
    return None


def resolve_dtype(dtype: str | torch.dtype, hf_config: Any, device: torch.device) -> torch.dtype:
    """Explicit names map directly; ``auto`` is the config's dtype on GPU (bfloat16 when the
    config names none) and ``CPU_AUTO_DTYPE`` on CPU."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype}")
        return dtype
    if dtype == "auto":
        if device.type == "cpu":
            return CPU_AUTO_DTYPE
        return config_dtype(hf_config) or torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {list(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]
