"""Compiled CPU float32 ops for the work of a decoder layer outside its linears
(``aioengine/worker/cpu/kernels/ops/``, built on first use into the aioengine cache by
``aioengine.worker.cpu.kernels.library`` like the other CPU kernels):
residual add + RMSNorm, rotary embedding + KV-cache write (float32 or float16 cache),
SiLU-and-multiply.

``CpuOps``' methods check their tensors and name what is wrong (``CpuOpsError``); the model's
CPU fast path (``aioengine.worker.cpu.layer_path``) checks shapes once per step and calls the
bare functions (``fn_*``) per layer.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from aioengine.worker.cpu.kernels import library
from aioengine.worker.cpu.kernels.build import KernelBuildError

logger = logging.getLogger(__name__)

_ERRORS = {-1: "bad sizes or leading dimensions", -2: "a KV slot is outside the cache"}


class CpuOpsError(ValueError):
    """Inputs a CPU op cannot take (dtype, device, layout, shape, slots out of range)."""


def ensure_built(compiler_name: str | None = None) -> Path:
    return library.ensure_built(library.OPS, compiler_name)


def _check_rows(name: str, t: torch.Tensor, cols: int) -> None:
    """A CPU float32 [M, >= cols] matrix with unit column stride."""
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise CpuOpsError(f"{name} must be a CPU float32 tensor, got {t.dtype} on {t.device}")
    if t.dim() != 2 or t.shape[1] < cols or (t.shape[0] > 1 and t.stride(1) != 1) \
            or (t.shape[0] > 1 and t.stride(0) < cols):
        raise CpuOpsError(f"{name} must be [M, {cols}] with contiguous rows, got shape "
                          f"{tuple(t.shape)} strides {t.stride()}")


def _ld(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else t.shape[1]


class CpuOps:
    def __init__(self, path: str) -> None:
        lib = library.open_library(library.OPS, path)
        self.path = path
        self._lib = lib  # keeps the library mapped as long as its functions are used
        self.fn_add_rms_norm = lib.add_rms_norm_f32
        self.fn_rope_store = lib.rope_store_f32
        self.fn_rope_store_f16 = lib.rope_store_f16  # the same over a float16 cache
        self.fn_silu_mul = lib.silu_mul_f32

    @staticmethod
    def _raise(code: int, what: str) -> None:
        if code:
            raise CpuOpsError(f"{what} rejected its inputs: {_ERRORS.get(code, code)}")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None, offset: bool = False,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """``out = rms_norm(x [+ residual]) * weight`` (``(1 + weight)`` with ``offset``); with
        ``residual``, ``residual += x`` in place first. ``x`` ``[M, N]``."""
        if x.dim() != 2:
            raise CpuOpsError(f"x must be [M, N], got shape {tuple(x.shape)}")
        m, n = x.shape
        _check_rows("x", x, n)
        if weight.dtype != torch.float32 or weight.shape != (n,) or not weight.is_contiguous():
            raise CpuOpsError(f"weight must be a contiguous float32 [{n}], got {weight.dtype} "
                              f"{tuple(weight.shape)}")
        if residual is not None:
            _check_rows("residual", residual, n)
            if residual.shape != x.shape:
                raise CpuOpsError(f"residual must have x's shape {tuple(x.shape)}, got "
                                  f"{tuple(residual.shape)}")
        if out is None:
            out = torch.empty(m, n)
        _check_rows("out", out, n)
        if out.shape[0] != m:
            raise CpuOpsError(f"out must have {m} rows, got {out.shape[0]}")
        code = self.fn_add_rms_norm(
            x.data_ptr(), _ld(x), None if residual is None else residual.data_ptr(),
            n if residual is None else _ld(residual), weight.data_ptr(), out.data_ptr(),
            _ld(out), m, n, eps, int(offset), int(residual is not None))
        self._raise(code, "add_rms_norm")
        return out

    def rope_store(self, qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                   cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor | None = None,
                   slots: torch.Tensor | None = None) -> None:
        """Rotate the q and k heads of ``qkv`` ``[T, (Hq + 2 Hkv) * D]`` in place ("rotate
        half", cos/sin ``[T, R/2]``, dims past R unrotated); with ``kv_cache``
        ``[2, Hkv, num_blocks, block_size, D]`` (float32, or float16: k and v rounded to
        nearest even), store each token's k and v at ``slots[t]``."""
        t = qkv.shape[0] if qkv.dim() == 2 else -1
        width = (num_heads + 2 * num_kv_heads) * head_dim
        if t < 0:
            raise CpuOpsError(f"qkv must be [T, {width}], got shape {tuple(qkv.shape)}")
        _check_rows("qkv", qkv, width)
        if qkv.shape[1] != width:
            raise CpuOpsError(f"qkv must be [T, {width}], got shape {tuple(qkv.shape)}")
        half = cos.shape[-1] if cos.dim() else -1
        for name, c in (("cos", cos), ("sin", sin)):
            if c.dtype != torch.float32 or c.shape != (t, half) or not c.is_contiguous():
                raise CpuOpsError(f"{name} must be a contiguous float32 [{t}, R/2], got "
                                  f"{c.dtype} {tuple(c.shape)}")
        if 2 * half > head_dim:
            raise CpuOpsError(f"rotary dims {2 * half} exceed head_dim {head_dim}")
        slots_per_head = 0
        if kv_cache is not None:
            if kv_cache.dtype not in (torch.float32, torch.float16) or kv_cache.dim() != 5 \
                    or tuple(kv_cache.shape[:2]) != (2, num_kv_heads) \
                    or kv_cache.shape[4] != head_dim or not kv_cache.is_contiguous():
                raise CpuOpsError(f"kv_cache must be a contiguous float32 or float16 [2, "
                                  f"{num_kv_heads}, "
                                  f"num_blocks, block_size, {head_dim}], got {kv_cache.dtype} "
                                  f"{tuple(kv_cache.shape)}")
            if slots is None or slots.dtype != torch.int64 or slots.shape != (t,) \
                    or not slots.is_contiguous():
                raise CpuOpsError(f"slots must be a contiguous int64 [{t}] with the cache")
            slots_per_head = kv_cache.shape[2] * kv_cache.shape[3]
        fn = self.fn_rope_store_f16 if kv_cache is not None \
            and kv_cache.dtype == torch.float16 else self.fn_rope_store
        code = fn(
            qkv.data_ptr(), _ld(qkv), t, num_heads, num_kv_heads, head_dim, cos.data_ptr(),
            sin.data_ptr(), half, None if kv_cache is None else kv_cache.data_ptr(),
            slots_per_head, None if slots is None else slots.data_ptr())
        self._raise(code, "rope_store")

    def silu_mul(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``silu(gate) * up`` of ``x`` ``[M, 2I]`` (gate then up) -> ``[M, I]``."""
        if x.dim() != 2 or x.shape[1] % 2:
            raise CpuOpsError(f"x must be [M, 2 * I], got shape {tuple(x.shape)}")
        m, n = x.shape[0], x.shape[1] // 2
        _check_rows("x", x, 2 * n)
        if out is None:
            out = torch.empty(m, n)
        _check_rows("out", out, n)
        if out.shape != (m, n):
            raise CpuOpsError(f"out must be [{m}, {n}], got {tuple(out.shape)}")
        self._raise(self.fn_silu_mul(x.data_ptr(), _ld(x), out.data_ptr(), _ld(out), m, n),
                    "silu_mul")
        return out


def load_cpu_ops(compiler: str | None = None) -> CpuOps:
    """Build (once per machine) and load the ops; ``KernelBuildError`` if that fails here."""
    return CpuOps(str(ensure_built(compiler)))


__all__ = ["CpuOps", "CpuOpsError", "KernelBuildError", "ensure_built", "load_cpu_ops"]
