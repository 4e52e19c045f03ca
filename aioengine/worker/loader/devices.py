"""``EngineConfig.device`` / ``dtype`` strings -> torch objects."""

from __future__ import annotations

from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# dtype="auto" on CPU is float32, chosen by measurement on a CPU without avx512_bf16/AMX
# (docs/benchmarks.md): batched decode, prefill and linears of every size were slower in
# bfloat16, the more so the more rows. Without native bf16 units the CPU converts on the fly, so
# bfloat16 only saves memory (batch-1 decode is memory-bound and was faster in bf16, but batched
# throughput is what we serve).
# Pass dtype="bfloat16" explicitly on CPUs with AMX/avx512_bf16.
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


def config_dtype(model_config: Any) -> torch.dtype | None:
    """The checkpoint's dtype as the config states it: a ``ModelSpec``'s ``checkpoint_dtype``,
    or a transformers config's ``dtype`` (legacy ``torch_dtype``)."""
    value = (getattr(model_config, "checkpoint_dtype", None)
             or getattr(model_config, "dtype", None)
             or getattr(model_config, "torch_dtype", None))
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        return _DTYPES.get(value.replace("torch.", ""))
    return None


def resolve_dtype(dtype: str | torch.dtype, model_config: Any,
                  device: torch.device) -> torch.dtype:
    """Explicit names map directly; ``auto`` is the config's dtype on GPU (bfloat16 when the
    config names none) and ``CPU_AUTO_DTYPE`` on CPU."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype}")
        return dtype
    if dtype == "auto":
        if device.type == "cpu":
            return CPU_AUTO_DTYPE
        return config_dtype(model_config) or torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {list(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]
