"""The quantized-matmul C library (``aioengine/worker/cpu/kernels/quant/``), built on first use
and loaded with ctypes (``aioengine.worker.cpu.kernels.library``).

``QuantKernel.matmul`` checks dtypes, shapes and strides in Python, then makes one C call that
releases the GIL. ``level`` picks the code path: ``-1`` the best this CPU runs, ``0`` the
portable scalar C, ``1`` AVX2+FMA+F16C, ``2`` AVX-512F (an error where the CPU lacks them).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from aioengine.worker.cpu.kernels import library
from aioengine.worker.cpu.kernels.build import KernelBuildError


@dataclass(frozen=True)
class QType:
    """A GGUF block type: its name, ggml type id, values per block and bytes per block."""

    name: str
    ggml_id: int
    block: int
    bytes: int

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of ``k`` values (ValueError when ``k`` is not whole blocks)."""
        if k <= 0 or k % self.block:
            raise ValueError(f"{self.name} rows hold whole blocks of {self.block} values; "
                             f"a row of {k} values is not")
        return k // self.block * self.bytes


QTYPES: dict[str, QType] = {q.name: q for q in (
    QType("q8_0", 8, 32, 34),
    QType("q4_0", 2, 32, 18),
    QType("q4_1", 3, 32, 20),
    QType("q5_0", 6, 32, 22),
    QType("q5_1", 7, 32, 24),
    QType("q2_k", 10, 256, 84),
    QType("q3_k", 11, 256, 110),
    QType("q4_k", 12, 256, 144),
    QType("q5_k", 13, 256, 176),
    QType("q6_k", 14, 256, 210),
)}
"""The block types the kernels compute, by lower-case name (``gguf`` type name lower-cased);
each is a row of the C side's traits table (``cpu/kernels/quant/traits.h``), checked against it
when the library loads."""


def qtype_of(t: object) -> QType:
    """A ``QType`` from its name (``"q4_k"``, ``"Q4_K"``) or a ``gguf.GGMLQuantizationType``."""
    name = getattr(t, "name", t)
    if isinstance(name, str) and name.lower() in QTYPES:
        return QTYPES[name.lower()]
    raise ValueError(f"quantized type {name!r} is not supported by the quantized kernels; "
                     f"supported: {sorted(QTYPES)}")


LEVELS = {-1: "best", 0: "scalar", 1: "avx2", 2: "avx512"}
X8_TILE_MIN_M = 3
"""The library's default for ``set_x8_tile`` (``x8_tile_min_m`` in quant/gemm_x8.c)."""

_ERRORS = {
    -1: "unsupported block type",
    -2: "bad shape (K not whole blocks, or strides smaller than the rows)",
    -3: "the rows' byte length does not match K and the block type",
    -4: "out of memory for the scratch",
    -5: "this CPU lacks the requested code path",
    -6: "thread count outside 1..256",
    -7: "int8 activations are implemented for q8_0, q4_0 and q4_1 only",
    -8: "a row id outside the weight's rows",
}
ACTIVATIONS = {"float32": 0, "int8": 1, "int16": 2}
"""``float32``: weights dequantized in registers times float activations; ``int16``:
activations rounded per 32 values to 16 bits (error <= 1.5e-5 of the block's largest value),
integer dot products; ``int8``: rounded to 8 bits, integer dot products (llama.cpp's CPU scheme;
q8_0, q4_0, q4_1 only)."""

X8_TYPES = ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
"""Types with the interleaved x8 layout (8 rows' blocks side by side, made at load)."""


class QkSeg(ctypes.Structure):
    """One output-row segment for ``qk_matmul_segs`` (``qk_seg`` in quant/gemm.h)."""

    _fields_ = [("t", ctypes.c_int32), ("x8", ctypes.c_int32), ("act", ctypes.c_int32),
                ("pad", ctypes.c_int32), ("w", ctypes.c_void_p), ("row_bytes", ctypes.c_int64),
                ("n", ctypes.c_int64), ("offset", ctypes.c_int64)]


def error_text(code: int) -> str:
    return _ERRORS.get(code, f"error {code}")


class QuantKernelError(ValueError):
    """Inputs the quantized kernels cannot take: the message names which and why."""


class QuantKernel:
    """The loaded library."""

    def __init__(self, path: str) -> None:
        lib = library.open_library(library.QUANT, path)
        lib.qk_set_max_level(2)  # the best the CPU runs, until ``set_max_isa``
        _check_types(lib)
        self.path = path
        self._lib = lib
        self.best_level: int = lib.qk_best_level()
        self.raw_matmul = lib.qk_matmul
        """The C entry point itself (no checks; ``QuantizedWeight`` calls it with rows it
        validated at load and activations it made contiguous): returns an error code."""
        self.raw_matmul_x8 = lib.qk_matmul_x8
        """The same for weights in the x8 layout (int16 activations)."""
        self.raw_matmul_segs = lib.qk_matmul_segs
        """``(segs, nseg, x, ldx, m, k, y, ldy, threads)``: every segment of a weight (a
        ``QkSeg`` array) in one call, unchecked like ``raw_matmul``."""

    def set_max_isa(self, isa: str) -> None:
        """Cap the code path of every call that asks for the best one (level -1, the GEMV's
        and the decode plan's too): ``scalar``, ``avx2``, ``avx512``, or ``best`` (what the
        CPU runs); ``CpuKernelConfig.quant_isa``. ``avx2`` on an AVX-512 machine runs what
        AVX2-only CPUs run (A/B, CI parity). Process-wide: the library is loaded once."""
        names = {v: k for k, v in LEVELS.items()}
        if isa not in names:
            raise QuantKernelError(f"quant_isa={isa!r}: expected one of {sorted(names)}")
        self._lib.qk_set_max_level(2 if names[isa] < 0 else names[isa])
        self.best_level = self._lib.qk_best_level()

    def set_spin_ns(self, ns: int) -> None:
        """How long an idle pool thread spins before it sleeps (default 200 us)."""
        self._lib.qk_set_spin_ns(int(ns))

    def set_x8_tile(self, min_m: int) -> None:
        """x8 products of ``min_m`` x rows or more use the two-group tile (default
        ``X8_TILE_MIN_M``; a larger value keeps the one-group kernel up to it: A/B, and the
        tests that the two give bit-identical outputs)."""
        if not isinstance(min_m, int) or min_m < 1:
            raise QuantKernelError(f"min_m must be an int >= 1, got {min_m!r}")
        self._lib.qk_set_x8_tile(min_m)

    def x8_tile(self) -> int:
        """The x rows from which the two-group tile runs now (``set_x8_tile``)."""
        return int(self._lib.qk_x8_tile())

    def pool_size(self) -> int:
        return int(self._lib.qk_pool_size())

    def _level(self, level: int) -> int:
        if level not in LEVELS:
            raise QuantKernelError(f"level must be one of {sorted(LEVELS)} "
                                   f"({', '.join(f'{k}: {v}' for k, v in LEVELS.items())}), "
                                   f"got {level!r}")
        if level > self.best_level:
            raise QuantKernelError(f"this CPU cannot run the {LEVELS[level]} path (best: "
                                   f"{LEVELS[self.best_level]})")
        return level

    @staticmethod
    def _check_w(qt: QType, w: torch.Tensor, n: int, k: int) -> None:
        if w.dtype != torch.uint8 or w.device.type != "cpu" or w.dim() != 2 \
                or not w.is_contiguous():
            raise QuantKernelError(f"quantized rows must be a contiguous CPU uint8 [N, "
                                   f"bytes_per_row] tensor, got {w.dtype} {tuple(w.shape)} on "
                                   f"{w.device}")
        try:
            rb = qt.row_bytes(k)
        except ValueError as e:
            raise QuantKernelError(str(e)) from None
        if w.shape[1] != rb:
            raise QuantKernelError(f"{qt.name} rows of K={k} values take {rb} bytes, got rows "
                                   f"of {w.shape[1]} bytes")
        if w.shape[0] != n:
            raise QuantKernelError(f"expected {n} rows, got {w.shape[0]}")

    def matmul(self, qtype: QType, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
               threads: int = 1, level: int = -1, activations: str = "float32") -> torch.Tensor:
        """``out[M, N] = x[M, K] @ W^T``; ``x`` and ``out`` float32 CPU with unit column
        stride (``out`` may be a column slice of a wider tensor); ``w`` ``[N, row_bytes]``;
        ``activations``: one of ``ACTIVATIONS``."""
        level = self._level(level)
        if activations not in ACTIVATIONS:
            raise QuantKernelError(f"activations must be one of {tuple(ACTIVATIONS)}, got "
                                   f"{activations!r}")
        if x.dtype != torch.float32 or out.dtype != torch.float32:
            raise QuantKernelError(f"x and out must be float32, got {x.dtype} and {out.dtype}")
        if x.dim() != 2 or out.dim() != 2 or x.stride(1) != 1 or out.stride(1) != 1 \
                or x.device.type != "cpu" or out.device.type != "cpu":
            raise QuantKernelError(f"x and out must be 2-D CPU tensors with unit column stride, "
                                   f"got {tuple(x.shape)} strides {x.stride()} and "
                                   f"{tuple(out.shape)} strides {out.stride()}")
        m, k = x.shape
        n = out.shape[1]
        if out.shape[0] != m:
            raise QuantKernelError(f"out has {out.shape[0]} rows, x has {m}")
        self._check_w(qtype, w, n, k)
        code = self._lib.qk_matmul(qtype.ggml_id, x.data_ptr(), max(x.stride(0), k), m,
                                   w.data_ptr(), w.shape[1], n, k, out.data_ptr(),
                                   max(out.stride(0), n), threads, level,
                                   ACTIVATIONS[activations])
        if code:
            raise QuantKernelError(f"qk_matmul rejected its inputs: "
                                   f"{_ERRORS.get(code, f'error {code}')} ({qtype.name}, M={m}, "
                                   f"N={n}, K={k}, threads={threads})")
        return out

    def dequantize(self, qtype: QType, w: torch.Tensor, k: int, out: torch.Tensor | None = None,
                   threads: int = 1, level: int = -1) -> torch.Tensor:
        """The float32 ``[N, K]`` values of ``w`` (into ``out`` when given)."""
        level = self._level(level)
        n = w.shape[0] if w.dim() == 2 else -1
        self._check_w(qtype, w, n, k)
        if out is None:
            out = torch.empty((n, k), dtype=torch.float32)
        elif out.dtype != torch.float32 or tuple(out.shape) != (n, k) or out.stride(1) != 1:
            raise QuantKernelError(f"out must be float32 [{n}, {k}] with unit column stride, got "
                                   f"{out.dtype} {tuple(out.shape)}")
        code = self._lib.qk_dequantize(qtype.ggml_id, w.data_ptr(), w.shape[1], n, k,
                                       out.data_ptr(), max(out.stride(0), k), threads, level)
        if code:
            raise QuantKernelError(f"qk_dequantize rejected its inputs: "
                                   f"{_ERRORS.get(code, f'error {code}')}")
        return out


    # -- the interleaved x8 layout (see cpu/kernels/quant/x8.h and docs/quantization.md)

    def x8_bytes(self, qtype: QType, n: int, k: int) -> int:
        """Bytes of ``n`` rows of ``k`` values in the x8 layout (0: no x8 layout for the type)."""
        return int(self._lib.qk_x8_bytes(qtype.ggml_id, n, k))

    def _check_x8(self, qtype: QType, w: torch.Tensor, n: int, k: int) -> None:
        if qtype.name not in X8_TYPES:
            raise QuantKernelError(f"{qtype.name} has no x8 layout (x8 types: {X8_TYPES})")
        if w.dtype != torch.uint8 or w.device.type != "cpu" or w.dim() != 1 \
                or not w.is_contiguous():
            raise QuantKernelError(f"x8 weights must be a contiguous 1-D CPU uint8 tensor, got "
                                   f"{w.dtype} {tuple(w.shape)} on {w.device}")
        try:
            qtype.row_bytes(k)
        except ValueError as e:
            raise QuantKernelError(str(e)) from None
        if n < 0 or w.numel() != self.x8_bytes(qtype, n, k):
            raise QuantKernelError(f"{n} {qtype.name} rows of {k} values take "
                                   f"{self.x8_bytes(qtype, n, k)} bytes in the x8 layout, got "
                                   f"{w.numel()}")

    def repack_x8(self, qtype: QType, w: torch.Tensor, k: int) -> torch.Tensor:
        """The rows ``w`` (``[N, row_bytes]``) in the x8 layout: a 1-D uint8 tensor."""
        if qtype.name not in X8_TYPES:
            raise QuantKernelError(f"{qtype.name} has no x8 layout (x8 types: {X8_TYPES})")
        n = w.shape[0] if w.dim() == 2 else -1
        self._check_w(qtype, w, n, k)
        out = torch.empty(self.x8_bytes(qtype, n, k), dtype=torch.uint8)
        code = self._lib.qk_repack_x8(qtype.ggml_id, w.data_ptr(), w.shape[1], n, k,
                                      out.data_ptr(), 0)
        if code:
            raise QuantKernelError(f"qk_repack_x8 rejected its inputs: {error_text(code)}")
        return out

    def unpack_x8(self, qtype: QType, w: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """The x8 layout ``w`` back to rows ``[n, row_bytes]`` (byte-equal to the original)."""
        self._check_x8(qtype, w, n, k)
        out = torch.empty(n, qtype.row_bytes(k), dtype=torch.uint8)
        code = self._lib.qk_repack_x8(qtype.ggml_id, w.data_ptr(), out.shape[1], n, k,
                                      out.data_ptr(), 1)
        if code:
            raise QuantKernelError(f"qk_repack_x8 rejected its inputs: {error_text(code)}")
        return out

    def matmul_x8(self, qtype: QType, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                  threads: int = 1, level: int = -1) -> torch.Tensor:
        """``out[M, N] = x[M, K] @ W^T`` with ``W`` in the x8 layout and int16 activations."""
        level = self._level(level)
        if x.dtype != torch.float32 or out.dtype != torch.float32 or x.dim() != 2 \
                or out.dim() != 2 or x.stride(1) != 1 or out.stride(1) != 1 \
                or x.device.type != "cpu" or out.device.type != "cpu":
            raise QuantKernelError(f"x and out must be 2-D float32 CPU tensors with unit column "
                                   f"stride, got {x.dtype} {tuple(x.shape)} and {out.dtype} "
                                   f"{tuple(out.shape)}")
        m, k = x.shape
        n = out.shape[1]
        if out.shape[0] != m:
            raise QuantKernelError(f"out has {out.shape[0]} rows, x has {m}")
        self._check_x8(qtype, w, n, k)
        code = self._lib.qk_matmul_x8(qtype.ggml_id, x.data_ptr(), max(x.stride(0), k), m,
                                      w.data_ptr(), n, k, out.data_ptr(), max(out.stride(0), n),
                                      threads, level)
        if code:
            raise QuantKernelError(f"qk_matmul_x8 rejected its inputs: {error_text(code)} "
                                   f"({qtype.name}, M={m}, N={n}, K={k}, threads={threads})")
        return out

    def dequantize_x8(self, qtype: QType, w: torch.Tensor, n: int, k: int,
                      out: torch.Tensor | None = None, threads: int = 1,
                      level: int = -1) -> torch.Tensor:
        """The float32 ``[n, k]`` values of x8-layout weights (into ``out`` when given)."""
        level = self._level(level)
        self._check_x8(qtype, w, n, k)
        if out is None:
            out = torch.empty((n, k), dtype=torch.float32)
        elif out.dtype != torch.float32 or tuple(out.shape) != (n, k) or out.stride(1) != 1:
            raise QuantKernelError(f"out must be float32 [{n}, {k}] with unit column stride, got "
                                   f"{out.dtype} {tuple(out.shape)}")
        code = self._lib.qk_dequantize_x8(qtype.ggml_id, w.data_ptr(), n, k, out.data_ptr(),
                                          max(out.stride(0), k), threads, level)
        if code:
            raise QuantKernelError(f"qk_dequantize_x8 rejected its inputs: {error_text(code)}")
        return out

    def rows_x8(self, qtype: QType, w: torch.Tensor, n: int, k: int,
                ids: torch.Tensor) -> torch.Tensor:
        """Float32 ``[len(ids), k]``: the rows ``ids`` (int64, 1-D) of x8-layout weights of
        ``n`` rows, each as ``dequantize_x8`` gives it (an embedding lookup)."""
        self._check_x8(qtype, w, n, k)
        if ids.dtype != torch.int64 or ids.dim() != 1 or ids.device.type != "cpu" \
                or not ids.is_contiguous():
            raise QuantKernelError(f"ids must be a contiguous 1-D CPU int64 tensor, got "
                                   f"{ids.dtype} {tuple(ids.shape)} on {ids.device}")
        out = torch.empty((ids.shape[0], k), dtype=torch.float32)
        code = self._lib.qk_rows_x8(qtype.ggml_id, w.data_ptr(), n, k, ids.data_ptr(),
                                    ids.shape[0], out.data_ptr(), k)
        if code:
            raise QuantKernelError(f"qk_rows_x8 rejected its inputs: {error_text(code)} "
                                   f"(ids {ids.min().item()}..{ids.max().item()}, {n} rows)")
        return out


def _check_types(lib: ctypes.CDLL) -> None:
    """``QTYPES`` must be the C traits table's rows (values and bytes per block)."""
    info = (ctypes.c_int64 * 3)()
    for q in QTYPES.values():
        if lib.qk_type_info(q.ggml_id, info) or (info[0], info[1]) != (q.block, q.bytes):
            raise KernelBuildError(f"QTYPES row {q} does not match the kernels' traits table "
                                   f"(got code {lib.qk_type_info(q.ggml_id, info)}, "
                                   f"{info[0]} values in {info[1]} bytes)")


def ensure_built(compiler_name: str | None = None) -> Path:
    return library.ensure_built(library.QUANT, compiler_name)


@functools.lru_cache(maxsize=4)
def _load(path: str) -> QuantKernel:
    return QuantKernel(path)


def load_quant_kernel(compiler_name: str | None = None) -> QuantKernel:
    """Build (once per machine) and load the library; one loaded object per built file.
    ``KernelBuildError`` when it cannot be built or loaded here."""
    return _load(str(ensure_built(compiler_name)))
