"""The worker's C libraries: where their sources are, the flags each is compiled with, and the
ctypes signature of every function Python calls. ``load`` builds a library on first use (see
``build``) and opens it with those signatures set; the Python wrappers
(``aioengine.worker.quant.kernel``, ``aioengine.worker.ops``, ``aioengine.worker.ops.plan``,
``aioengine.worker.attention.cpu_kernel``, ``aioengine.worker.gemv``) check their tensors and call
through it."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aioengine.worker.cpu.kernels.build import KernelBuildError, build_shared

ROOT = Path(__file__).parent

_P, _I, _I32, _F, _C = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float,
                        ctypes.c_int)
Signature = tuple[Any, tuple[Any, ...]]
"""``(restype, argtypes)`` of one C function (restype None: void)."""


@dataclass(frozen=True)
class Library:
    """One shared object: every ``.c`` file of ``folder`` compiled together with ``flags``."""

    name: str
    """The cached file's stem (``<name>-<key>.so``)."""
    folder: str
    flags: tuple[str, ...]
    what: str
    """What it is, in log lines."""
    functions: tuple[tuple[str, Signature], ...]
    shared: tuple[str, ...] = ()
    """Folders of headers shared between libraries (``common``) that its files include by a
    relative path (``"../common/fast_exp.h"``, so no ``-I`` and no install path in the flags);
    their headers are part of the build key like its own."""

    @property
    def sources(self) -> list[Path]:
        return sorted((ROOT / self.folder).glob("*.c"))

    @property
    def headers(self) -> list[Path]:
        return [p for folder in (self.folder, *self.shared)
                for p in sorted((ROOT / folder).glob("*.h"))]


_ATTN = (_P, _I, _P, _I, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _F)
_ROPE = (_P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P)

QUANT = Library(
    "qkernels", "quant",
    # No -march: the AVX2 and AVX-512 paths are compiled with __attribute__((target)) and chosen
    # at run time, so the scalar path stays portable C and the dispatch is exercised on every
    # machine (CpuKernelConfig.quant_isa caps it).
    ("-O3", "-std=c11", "-fPIC", "-shared", "-pthread"),
    "quantized matmul kernels",
    (("qk_version", (_C, ())),
     ("qk_best_level", (_C, ())),
     ("qk_set_max_level", (None, (_C,))),
     ("qk_set_spin_ns", (None, (ctypes.c_long,))),
     ("qk_pool_size", (_C, ())),
     ("qk_pool_run", (_C, (_P, _P, _C, _C))),
     ("qk_type_info", (_C, (_C, ctypes.POINTER(_I)))),
     ("qk_matmul", (_C, (_C, _P, _I, _I, _P, _I, _I, _I, _P, _I, _C, _C, _C))),
     ("qk_dequantize", (_C, (_C, _P, _I, _I, _I, _P, _I, _C, _C))),
     ("qk_matmul_segs", (_C, (_P, _C, _P, _I, _I, _I, _P, _I, _C))),
     ("qk_set_x8_tile", (None, (_I,))),
     ("qk_x8_tile", (_I, ())),
     ("qk_x8_bytes", (_I, (_C, _I, _I))),
     ("qk_repack_x8", (_C, (_C, _P, _I, _I, _I, _P, _C))),
     ("qk_matmul_x8", (_C, (_C, _P, _I, _I, _P, _I, _I, _P, _I, _C, _C))),
     ("qk_rows_x8", (_C, (_C, _P, _I, _I, _P, _I, _P, _I))),
     ("qk_dequantize_x8", (_C, (_C, _P, _I, _I, _P, _I, _C, _C))),
     ("qk_gemv_f32", (_C, (_P, _I, _I, _P, _I, _I, _P, _I, _C, _C)))),
)
OPS = Library(
    "cpu_ops", "ops",
    # -ffp-contract=off: no FMA contraction, so products round as torch's element-wise ops
    # round them; -fno-trapping-math lets the exp clamps become vector selects.
    ("-O3", "-march=native", "-ffp-contract=off", "-fno-trapping-math", "-fopenmp-simd",
     "-std=c11", "-fPIC", "-shared"),
    "CPU layer ops",
    (("add_rms_norm_f32", (_C, (_P, _I, _P, _I, _P, _P, _I, _I, _I, _F, _C, _C))),
     ("rope_store_f32", (_C, _ROPE)),
     ("rope_store_f16", (_C, _ROPE)),
     ("silu_mul_f32", (_C, (_P, _I, _P, _I, _I, _I)))),
    shared=("common",),
)
PLAN = Library(
    "decode_plan", "plan", ("-O2", "-std=c11", "-fPIC", "-shared"), "CPU decode plan",
    (("plan_run", (_C, (_P, ctypes.POINTER(_I)))),
     ("plan_sizeof", (_I, (_C,)))),
)
ATTENTION = Library(
    "paged_decode", "attention",
    # -fopenmp-simd honours the kernel's `omp simd` hints without linking an OpenMP runtime;
    # -fno-trapping-math lets the exp loop's clamp become a vector select (no FP exception flags
    # are read); -ffp-contract=fast allows FMAs (ISO C mode turns contraction off). No
    # -ffast-math: the softmax relies on IEEE max/inf behaviour.
    ("-O3", "-march=native", "-ffp-contract=fast", "-fno-trapping-math", "-fopenmp-simd",
     "-std=c11", "-fPIC", "-shared"),
    "CPU decode attention kernel",
    (("paged_decode_attention", (_C, _ATTN)),
     ("paged_decode_attention_f16", (_C, _ATTN)),
     ("paged_decode_attention_heads", (_C, (*_ATTN, _I, _I))),
     ("paged_decode_attention_heads_f16", (_C, (*_ATTN, _I, _I)))),
    shared=("common",),
)
LIBRARIES = {lib.name: lib for lib in (QUANT, OPS, PLAN, ATTENTION)}


def ensure_built(lib: Library, compiler_name: str | None = None) -> Path:
    """``lib``'s shared object, compiled first if no build for this key exists (compiler:
    ``compiler_name``, else ``$AIOENGINE_CC``, else ``cc``)."""
    return build_shared(lib.name, lib.sources, lib.flags, lib.what, compiler_name, lib.headers)


@functools.lru_cache(maxsize=16)
def open_library(lib: Library, path: str) -> ctypes.CDLL:
    """The built file at ``path``, opened once per process, with ``lib``'s signatures set."""
    try:
        cdll = ctypes.CDLL(path)
    except OSError as e:
        raise KernelBuildError(f"cannot load the built {lib.what} {path}: {e}") from e
    for name, (restype, argtypes) in lib.functions:
        fn = getattr(cdll, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return cdll


def load(lib: Library, compiler_name: str | None = None) -> ctypes.CDLL:
    """Build (once per machine) and open ``lib``; ``KernelBuildError`` when it cannot be built
    or loaded here."""
    return open_library(lib, str(ensure_built(lib, compiler_name)))


def fn_address(fn: Any) -> int:
    """The address of a ctypes function (to hand to other compiled code)."""
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    if not addr:
        raise KernelBuildError(f"no address for {fn!r}")
    return addr


__all__ = ["ATTENTION", "LIBRARIES", "OPS", "PLAN", "QUANT", "KernelBuildError", "Library",
           "ensure_built", "fn_address", "load", "open_library"]
