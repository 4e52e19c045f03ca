"""The compiled decode kernel (``aioengine/worker/cpu/kernels/attention/``, built and loaded by
``aioengine.worker.cpu.kernels.library``): shape, dtype and layout checks in Python (a few
attribute reads per layer), then one C call that releases the GIL."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from aioengine.worker.cpu.kernels import library
from aioengine.worker.cpu.kernels.build import COMPILER_ENV, KernelBuildError

logger = logging.getLogger(__name__)

KERNEL_MODES = ("auto", "kernel", "sdpa")

_ERRORS = {
    -1: "a context length is < 1 or longer than its block table holds",
    -2: "a block id is outside the KV cache",
    -3: "out of memory for the score scratch",
    -4: "bad head counts or sizes",
    -5: "a row index is outside q/out",
    -6: "a window start is < 0 or not before its context length",
}

__all__ = ["COMPILER_ENV", "KERNEL_MODES", "BoundDecode", "DecodeKernelError", "KernelBuildError",
           "PagedDecodeKernel", "ensure_built", "load_decode_kernel", "select_decode_kernel"]


def ensure_built(compiler_name: str | None = None) -> Path:
    """The kernel's shared object, compiled first if no build for this key exists."""
    return library.ensure_built(library.ATTENTION, compiler_name)


class DecodeKernelError(ValueError):
    """Inputs the decode kernel cannot take (wrong dtype, device, layout or shape, ids out of
    range): the message names which."""


class PagedDecodeKernel:
    """``kernel(q, kv_cache, block_tables, context_lens, scale, out, rows)``: attention of one
    query token per sequence over its paged KV, written into ``out``."""

    def __init__(self, path: str) -> None:
        lib = library.open_library(library.ATTENTION, path)
        fn = lib.paged_decode_attention
        fn16 = lib.paged_decode_attention_f16  # the same over a float16 cache
        self.path = path
        self._lib = lib  # keeps the library mapped as long as the function is used
        self._fn = fn
        self._fn16 = fn16
        # the same for a range of kv heads (the decode plan splits heads over threads)
        self.heads_fn = lib.paged_decode_attention_heads
        self.heads_fn16 = lib.paged_decode_attention_heads_f16

    def fn_for(self, kv_cache: torch.Tensor) -> Any:
        """The C function for this cache (float32 or float16)."""
        return self._fn16 if kv_cache.dtype == torch.float16 else self._fn

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, out: torch.Tensor,
                 rows: torch.Tensor | None = None,
                 window_starts: torch.Tensor | None = None) -> torch.Tensor:
        """``q`` ``[T, Hq, D]`` float32 (rows may be strided, each row's ``[Hq, D]``
        contiguous); ``kv_cache`` ``[2, Hkv, num_blocks, block_size, D]`` contiguous float32
        or float16;
        ``block_tables`` ``[B, max_blocks]`` and ``context_lens`` ``[B]`` int64; ``out``
        ``[T, Hq, D]`` contiguous float32. Sequence b uses row ``rows[b]`` of q and out
        (``rows`` int64 ``[B]``; None: row b). ``window_starts`` int64 ``[B]``: sequence b
        attends keys ``window_starts[b] .. context_lens[b] - 1`` (sliding window; None: from
        0). Returns ``out``."""
        self.prepare(q, kv_cache, block_tables, context_lens, scale, out, rows,
                     window_starts)(q.data_ptr(), kv_cache.data_ptr(), out.data_ptr())
        return out

    def prepare(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                context_lens: torch.Tensor, scale: float, out: torch.Tensor,
                rows: torch.Tensor | None = None,
                window_starts: torch.Tensor | None = None) -> BoundDecode:
        """Check the arguments as a call does, without running it: the bare call
        (``bind``'s) for tensors of these shapes, strides and dtypes."""
        if q.dtype != torch.float32 or out.dtype != torch.float32 \
                or kv_cache.dtype not in (torch.float32, torch.float16):
            raise DecodeKernelError(f"q and out must be float32 and kv_cache float32 or "
                                    f"float16, got {q.dtype}, {out.dtype}, {kv_cache.dtype}")
        if q.device.type != "cpu" or kv_cache.device.type != "cpu":
            raise DecodeKernelError(f"the decode kernel runs on CPU tensors, got q on "
                                    f"{q.device} and kv_cache on {kv_cache.device}")
        if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or not kv_cache.is_contiguous():
            raise DecodeKernelError("kv_cache must be a contiguous [2, Hkv, num_blocks, "
                                    f"block_size, D] tensor, got shape {tuple(kv_cache.shape)}")
        _, hkv, num_blocks, bs, d = kv_cache.shape
        if q.dim() != 3 or q.shape[2] != d or q.stride(2) != 1 or q.stride(1) != d:
            raise DecodeKernelError(f"q must be [T, Hq, {d}] with each row's [Hq, D] "
                                    f"contiguous, got shape {tuple(q.shape)} strides "
                                    f"{q.stride()}")
        t, hq = q.shape[0], q.shape[1]
        if hq % hkv:
            raise DecodeKernelError(f"{hq} query heads do not divide into {hkv} kv heads")
        if out.shape != q.shape or not out.is_contiguous():
            raise DecodeKernelError(f"out must be contiguous with q's shape {tuple(q.shape)}, "
                                    f"got {tuple(out.shape)}")
        if block_tables.dtype != torch.int64 or block_tables.dim() != 2 \
                or not block_tables.is_contiguous():
            raise DecodeKernelError("block_tables must be a contiguous int64 [B, max_blocks] "
                                    f"tensor, got {block_tables.dtype} "
                                    f"{tuple(block_tables.shape)}")
        b, max_blocks = block_tables.shape
        if context_lens.dtype != torch.int64 or context_lens.shape != (b,) \
                or not context_lens.is_contiguous():
            raise DecodeKernelError(f"context_lens must be a contiguous int64 [{b}] tensor, got "
                                    f"{context_lens.dtype} {tuple(context_lens.shape)}")
        if rows is not None and (rows.dtype != torch.int64 or rows.shape != (b,)
                                 or not rows.is_contiguous()):
            raise DecodeKernelError(f"rows must be a contiguous int64 [{b}] tensor, got "
                                    f"{rows.dtype} {tuple(rows.shape)}")
        if window_starts is not None and (window_starts.dtype != torch.int64
                                          or window_starts.shape != (b,)
                                          or not window_starts.is_contiguous()):
            raise DecodeKernelError(f"window_starts must be a contiguous int64 [{b}] tensor, "
                                    f"got {window_starts.dtype} {tuple(window_starts.shape)}")
        return BoundDecode(self.fn_for(kv_cache), q.stride(0),
                           None if rows is None else rows.data_ptr(), t,
                           block_tables.data_ptr(), context_lens.data_ptr(),
                           None if window_starts is None else window_starts.data_ptr(), b, hq,
                           hkv, d, bs, num_blocks, max_blocks, scale)

    def bind(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
             context_lens: torch.Tensor, scale: float, out: torch.Tensor,
             rows: torch.Tensor | None = None,
             window_starts: torch.Tensor | None = None) -> BoundDecode:
        """Check the arguments as a call does (and run it), then return the bare call for
        more layers of this step: ``bound(q_ptr, kv_cache_ptr, out_ptr)`` with q, kv cache
        and out of the same shapes, strides and dtypes (the tables and lengths must stay
        alive and unchanged: the step's metadata holds them)."""
        call = self.prepare(q, kv_cache, block_tables, context_lens, scale, out, rows,
                            window_starts)
        call(q.data_ptr(), kv_cache.data_ptr(), out.data_ptr())
        return call


class BoundDecode:
    """The kernel with everything but the q, kv cache and out pointers fixed (one step)."""

    __slots__ = ("_args", "_fn")

    def __init__(self, fn: Any, q_stride: int, rows: int | None, t: int, tables: int,
                 lens: int, windows: int | None, b: int, hq: int, hkv: int, d: int, bs: int,
                 num_blocks: int, max_blocks: int, scale: float) -> None:
        self._fn = fn
        self._args = (q_stride, rows, t, tables, lens, windows, b, hq, hkv, d, bs, num_blocks,
                      max_blocks, scale)

    @property
    def fn(self) -> Any:
        """The C function (float32 or float16 cache)."""
        return self._fn

    @property
    def args(self) -> tuple[Any, ...]:
        """``(q_stride, rows, t, tables, lens, windows, b, hq, hkv, d, bs, num_blocks,
        max_blocks, scale)``: pointers as ints (None: NULL)."""
        return self._args

    def __call__(self, q: int, kv_cache: int, out: int) -> None:
        a = self._args
        code = self._fn(q, a[0], a[1], a[2], kv_cache, a[3], a[4], a[5], out, *a[6:])
        if code:
            raise DecodeKernelError(f"decode kernel rejected its inputs: "
                                    f"{_ERRORS.get(code, f'error {code}')} (B={a[6]}, "
                                    f"T={a[2]}, num_blocks={a[11]}, block_size={a[10]}, "
                                    f"max_blocks={a[12]})")


def load_decode_kernel(compiler: str | None = None) -> PagedDecodeKernel:
    """Build (once per machine, see ``build``) and load the kernel; ``KernelBuildError`` if it
    cannot be built or loaded here."""
    return PagedDecodeKernel(str(ensure_built(compiler)))


def select_decode_kernel(mode: str, device: torch.device | str,
                         dtype: torch.dtype) -> PagedDecodeKernel | None:
    """The kernel for CPU float32 decode under ``mode`` (``EngineConfig.cpu_decode_attention``):
    ``sdpa``: None (torch SDPA); ``kernel``: the kernel, or ``KernelBuildError``; ``auto``: the
    kernel, or None with one warning saying why it could not be built. Other devices and dtypes
    always get None (their SDPA path is unchanged)."""
    if mode not in KERNEL_MODES:
        raise ValueError(f"cpu_decode_attention must be one of {KERNEL_MODES}, got {mode!r}")
    if mode == "sdpa" or torch.device(device).type != "cpu" or dtype != torch.float32:
        return None
    if mode == "kernel":
        return load_decode_kernel()
    try:
        return load_decode_kernel()
    except KernelBuildError as e:
        logger.warning("CPU decode attention falls back to torch SDPA: %s", e)
        return None
