"""The GGUF tensor types the loader reads (dequantized to the engine's dtype at load)."""

from __future__ import annotations

from collections.abc import Iterable

# What llama.cpp's common files use: *_F16/BF16 exports, *_Q8_0, *_Q4_0/Q4_1, and the k-quant
# mixes (*_Q4_K_M holds Q4_K, Q5_K and Q6_K tensors; *_Q3_K_M adds Q3_K).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K",
                   "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def unsupported_types(type_names: Iterable[str]) -> list[str]:
    """The names among ``type_names`` the loader cannot read, sorted, each once."""
    return sorted({name for name in type_names if name not in SUPPORTED_TYPES})
