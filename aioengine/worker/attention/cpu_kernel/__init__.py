"""A compiled C kernel for CPU float32 paged decode attention over a float32 or float16 KV
cache: built on first use with the system C compiler into the aioengine cache, loaded with
ctypes (its C in ``aioengine/worker/cpu/kernels/attention/``; see ``kernel``)."""

from aioengine.worker.attention.cpu_kernel.kernel import (
    COMPILER_ENV,
    KERNEL_MODES,
    DecodeKernelError,
    KernelBuildError,
    PagedDecodeKernel,
    ensure_built,
    load_decode_kernel,
    select_decode_kernel,
)

__all__ = [
    "COMPILER_ENV",
    "KERNEL_MODES",
    "DecodeKernelError",
    "KernelBuildError",
    "PagedDecodeKernel",
    "ensure_built",
    "load_decode_kernel",
    "select_decode_kernel",
]
