"""Paged KV cache allocation and capacity planning.

One tensor per layer, ``[2, num_kv_heads_per_rank, num_blocks, block_size, head_dim]``
(k then v); block ids from the engine's block manager index dimension 2. See
``aioengine.worker.attention.paged`` for why heads come before blocks.

On CPU the cache lives in anonymous private ``mmap`` memory, written with zeros when it is
allocated (and ``mlock``-ed with ``EngineConfig.kv_cache_lock``): the resident size after start
is the size the engine keeps, and a pool the machine cannot hold fails at start rather than as an
out-of-memory kill hours later (issue 40; the pool is sized by need, ``worker.capacity``). The
mapping is the tensor's own, so the memory goes back to the kernel when the cache is freed. On
GPU, ``torch.zeros``.

The cache's dtype is ``EngineConfig.kv_cache_dtype`` resolved by ``kv_cache_dtype``: float16
for a float32 model on CPU by default (the decode kernel and the rope + KV-write op read and
write float16), the model's dtype otherwise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
import resource
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
                      device: torch.device | str, tp_size: int = 1, *,
                      lock: bool = False) -> list[torch.Tensor]:
    """Zeroed KV cache, one tensor per layer (zeros: unwritten slots never hold NaN); resident
    on CPU (``resident_zeros``), locked in RAM with ``lock``."""
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks} and "
                         f"{block_size}")
    spec = _spec(model_config)
    shape = (2, spec.kv_heads_per_rank(tp_size), num_blocks, block_size, spec.head_dim)
    if torch.device(device).type == "cpu":
        return [resident_zeros(shape, dtype, lock=lock) for _ in range(spec.num_layers)]
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]


def resident_zeros(shape: tuple[int, ...], dtype: torch.dtype, *,
                   lock: bool = False) -> torch.Tensor:
    """A zero CPU tensor over anonymous private memory, every page written now (resident from
    here on), and ``mlock``-ed with ``lock`` (an ``OSError`` naming the memlock limit when the
    kernel refuses). The tensor holds the only reference to its mapping (``torch.frombuffer``
    keeps it alive), so the memory goes back to the kernel when the tensor is freed."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    tensor = torch.frombuffer(buf, dtype=dtype).view(shape)
    if lock:
        _mlock(tensor.data_ptr(), nbytes)  # faults every page in, and keeps it
    tensor.zero_()  # the kernel commits a page on its first write, zeros included
    return tensor


def _mlock(address: int, nbytes: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(nbytes)) != 0:
        err = ctypes.get_errno()
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"
        raise OSError(err, f"kv_cache_lock: mlock of {nbytes} bytes of KV cache failed "
                      f"({os.strerror(err)}); the memlock limit is {limit} (raise it with "
                      "`ulimit -l` or LimitMEMLOCK=, or turn kv_cache_lock off)")
