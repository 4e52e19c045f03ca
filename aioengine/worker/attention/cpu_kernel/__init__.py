"""A compiled C kernel for CPU float32 paged decode attention over a float32 or float16 KV
cache: built on first use with the system C compiler into the aioengine cache, loaded with
ctypes (see ``build`` and ``kernel``)."""

from aioengine.worker.attention.cpu_kernel.build import (
    COMPILER_ENV,
    KernelBuildError,
    ensure_built,
)
from aioengine.worker.attention.cpu_kernel.kernel import (
    KERNEL_MODES,
    DecodeKernelError,
    PagedDecodeKernel,
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
