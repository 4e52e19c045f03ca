"""Build the C decode kernel once per (source, flags, compiler, CPU) into the aioengine cache
(``$AIOENGINE_CACHE/kernels/paged_decode-<key>.so``; the machinery is ``aioengine.worker.cbuild``,
shared with the quantized-matmul kernels)."""

from __future__ import annotations

from pathlib import Path

from aioengine.worker.cbuild import (
    COMPILER_ENV,
    DEFAULT_COMPILER,
    KernelBuildError,
    build_shared,
    find_compiler,
    kernel_dir,
)

__all__ = ["COMPILER_ENV", "DEFAULT_COMPILER", "FLAGS", "KernelBuildError", "SOURCE",
           "ensure_built", "find_compiler", "kernel_dir"]

SOURCE = Path(__file__).with_name("paged_decode.c")
# -fopenmp-simd honours the kernel's `omp simd` hints without linking an OpenMP runtime;
# -fno-trapping-math lets the exp loop's clamp become a vector select (no FP exception flags are
# read); -ffp-contract=fast allows FMAs (ISO C mode turns contraction off). No -ffast-math: the
# softmax relies on IEEE max/inf behaviour.
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-trapping-math", "-fopenmp-simd",
         "-std=c11", "-fPIC", "-shared")


def ensure_built(compiler_name: str | None = None) -> Path:
    """The kernel's shared object, compiled first if no build for this key exists."""
    return build_shared("paged_decode", SOURCE, FLAGS, "CPU decode attention kernel",
                        compiler_name)
