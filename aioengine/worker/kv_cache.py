"""Paged KV cache allocation and capacity planning.

One tensor per layer, ``[2, num_kv_heads_per_rank, num_blocks, block_size, head_dim]``
(k then v); block ids from the engine's block manager index dimension 2. See
``aioengine.worker.attention.paged`` for why heads come before blocks.

On CPU the cache lives in anonymous private ``mmap`` memory: the kernel hands out zero pages
and commits one only when it is first written, so allocating the default capacity (gigabytes
for ``max_num_seqs`` full contexts) is instant and resident memory follows the blocks actually
used. ``torch.zeros`` would write every byte up front (seconds on a loaded box, all charged to
RSS at once). On GPU, ``torch.zeros``.

The cache's dtype is ``EngineConfig.kv_cache_dtype`` resolved by ``kv_cache_dtype``: float16
for a float32 model on CPU by default (the decode kernel and the rope + KV-write op read and
write float16), the model's dtype otherwise.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import torch

from aioengine.worker.models.spec import ModelSpec


def _spec(model_config: Any) -> ModelSpec:
    return model_config if isinstance(model_config, ModelSpec) else ModelSpec.from_hf(
        model_config)


_KV_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def kv_cache_dtype(setting: str, model_dtype: torch.dtype, device: torch.device | str,
                   decode_kernel: bool) -> torch.dtype:
    """The dtype the KV cache stores under ``EngineConfig.kv_cache_dtype``. ``auto``: float16
    for a float32 model on CPU whose decodes go to the compiled kernel (``decode_kernel``),
    else the model's dtype (SDPA would widen every block it reads: slower)."""
    if setting == "model":
        return model_dtype
    if setting == "auto":
        cpu = torch.device(device).type == "cpu"
        return torch.float16 if cpu and model_dtype == torch.float32 and decode_kernel \
            else model_dtype
    if setting not in _KV_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of ('auto', 'model', "
                         f"{', '.join(map(repr, _KV_DTYPES))}), got {setting!r}")
    return _KV_DTYPES[setting]


def kv_cache_bytes_per_block(model_config: Any, block_size: int, dtype: torch.dtype,
                             tp_size: int = 1) -> int:
    """Bytes one block takes on one rank, over all layers (k and v)."""
    spec = _spec(model_config)
    kv_heads = spec.kv_heads_per_rank(tp_size)
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * spec.num_layers * block_size * kv_heads * spec.head_dim * elem


def num_blocks_for_bytes(model_config: Any, memory_bytes: int, block_size: int,
                         dtype: torch.dtype, tp_size: int = 1) -> int:
    """How many blocks fit in ``memory_bytes`` (at least 1, or a ValueError saying why not)."""
    per_block = kv_cache_bytes_per_block(model_config, block_size, dtype, tp_size)
    blocks = memory_bytes // per_block
    if blocks < 1:
        raise ValueError(f"KV cache memory of {memory_bytes} bytes holds no block: one block "
                         f"of {block_size} tokens needs {per_block} bytes")
    return int(blocks)


def allocate_kv_cache(model_config: Any, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device | str, tp_size: int = 1) -> list[torch.Tensor]:
    """Zeroed KV cache, one tensor per layer (zeros: unwritten slots never hold NaN); lazily
    committed on CPU (``lazy_zeros``)."""
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks} and "
                         f"{block_size}")
    spec = _spec(model_config)
    shape = (2, spec.kv_heads_per_rank(tp_size), num_blocks, block_size, spec.head_dim)
    if torch.device(device).type == "cpu":
        return [lazy_zeros(shape, dtype) for _ in range(spec.num_layers)]
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero CPU tensor over anonymous private memory, committed page by page on first write.
    The tensor holds the only reference to its mapping (``torch.frombuffer`` keeps it alive),
    so the memory goes back to the kernel when the tensor is freed."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buf, dtype=dtype).view(shape)
