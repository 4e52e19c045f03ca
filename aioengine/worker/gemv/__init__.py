"""Float32 GEMV for CPU decode: ``y = x @ W^T (+ b)`` for a few rows of ``x``, by the compiled
C kernels' "F32 type" (``qk_gemv_f32`` in ``aioengine/worker/cpu/kernels/quant/dense_f32.c``,
built on first use into the aioengine cache) that streams the weights once at close to the
machine's read bandwidth and splits the rows over the kernels' one thread pool (shared with
the quantized kernels: one pool per process). Anything else (more rows, other dtypes or
devices, the kernel unavailable) is ``torch.nn.functional.linear``.

Why: torch's sgemm for one row reads the weights well below the machine's read bandwidth (a
batch-1 decode step is memory-bound), while one sequential stream per thread gets close to it,
closer still on the huge pages ``huge_page_weights`` moves them to (figures:
docs/benchmarks.md, "Measurements behind design choices").
"""

from __future__ import annotations

import logging
import mmap
from pathlib import Path

import torch
import torch.nn.functional as F

from aioengine.worker.cpu.kernels import library
from aioengine.worker.cpu.kernels.build import KernelBuildError

logger = logging.getLogger(__name__)

MAX_ROWS = 8
"""Up to this many rows of x always take the kernel. More (prefill, big batches) take torch's
GEMM, which does more flops per thread than the kernel at many rows (MKL's blocking;
docs/benchmarks.md), unless the kernel's pool has more threads than torch's: then every row count
takes the kernel (see ``max_kernel_rows``)."""
HUGE_PAGE = 2 << 20

_ERRORS = {-2: "bad shapes or leading dimensions", -6: "thread count out of 1..256",
           -5: "this CPU lacks the requested code path"}


class GemvError(ValueError):
    """Inputs the GEMV kernel cannot take; the message says which."""


def ensure_built(compiler_name: str | None = None) -> Path:
    """The kernels' shared object (the quantized kernels' library, which holds the F32 GEMV),
    compiled first if no build for this key exists."""
    return library.ensure_built(library.QUANT, compiler_name)


class GemvKernel:
    """``kernel(x, weight, bias=None, threads=1)``: ``x`` ``[M, K]`` float32 CPU with unit
    column stride, ``weight`` ``[N, K]`` contiguous float32 -> ``[M, N]``."""

    def __init__(self, path: str) -> None:
        lib = library.open_library(library.QUANT, path)
        fn = lib.qk_gemv_f32
        self.path = path
        self.best_level = lib.qk_best_level()
        self.has_avx2 = self.best_level >= 1
        self._lib = lib
        self._fn = fn

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 threads: int = 1, level: int = -1) -> torch.Tensor:
        """``level``: the code path, -1 the best this CPU runs (0 portable C, 1 AVX2+FMA,
        2 AVX-512F); one the CPU lacks is a ``GemvError``."""
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            raise GemvError(f"x and weight must be float32, got {x.dtype} and {weight.dtype}")
        if x.device.type != "cpu" or weight.device.type != "cpu":
            raise GemvError(f"the GEMV kernel runs on CPU tensors, got x on {x.device} and "
                            f"weight on {weight.device}")
        if weight.dim() != 2 or not weight.is_contiguous():
            raise GemvError(f"weight must be a contiguous [N, K] matrix, got shape "
                            f"{tuple(weight.shape)} strides {weight.stride()}")
        n, k = weight.shape
        if x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1 or x.shape[0] < 1:
            raise GemvError(f"x must be [M >= 1, {k}] with contiguous rows, got shape "
                            f"{tuple(x.shape)} strides {x.stride()}")
        m = x.shape[0]
        y = torch.empty((m, n), dtype=torch.float32)
        code = self._fn(x.data_ptr(), x.stride(0), m, weight.data_ptr(), n, k, y.data_ptr(), n,
                        threads, level)
        if code:
            raise GemvError(f"GEMV kernel rejected its inputs: {_ERRORS.get(code, code)} "
                            f"(M={m}, N={n}, K={k}, threads={threads})")
        if bias is not None:
            y += bias
        return y


_kernel: GemvKernel | None = None
_threads = 1


def max_kernel_rows() -> int:
    """The most rows of x ``linear`` hands the kernel: ``MAX_ROWS``, or any number while the
    kernel's pool has more threads than torch's. On CPU torch keeps a core free by default (its
    OpenMP threads spin, and slow everything else down, when the cores are oversubscribed),
    while the kernel's pool may use every core where that measured faster; with twice torch's
    threads the kernel outruns torch's GEMM at every row count, so a prefill or a mixed
    prefill-and-decode step goes through it too."""
    return MAX_ROWS if _threads <= torch.get_num_threads() else 1 << 62


def configure(device: torch.device | str, dtype: torch.dtype, threads: int,
              enabled: bool = True) -> bool:
    """Load the kernel for this process when the model runs float32 on CPU and ``enabled``
    (``CpuKernelConfig.cpu_gemv``; once), and set the threads it splits rows over. Returns
    whether ``linear`` will use it. A kernel that cannot be built here is one warning and
    torch's GEMM."""
    global _kernel, _threads
    _threads = max(1, min(256, threads))
    if torch.device(device).type != "cpu" or dtype != torch.float32 or not enabled:
        _kernel = None
        return False
    if _kernel is None:
        try:
            _kernel = GemvKernel(str(ensure_built()))
        except KernelBuildError as e:
            logger.warning("CPU float32 GEMV falls back to torch: %s", e)
            return False
    return True


def calibrate_threads(weight: torch.Tensor, budget: int, reps: int = 5) -> int:
    """The thread count in ``1..budget`` that runs a batch-1 GEMV of ``weight`` fastest here
    (median of ``reps``); a count must beat every smaller one by 5% to be chosen. Extra threads
    help when one core cannot saturate memory and the cores are free; they hurt on a machine
    whose other cores are busy. A few milliseconds at load, per machine and model."""
    if _kernel is None or budget <= 1:
        return 1
    from aioengine.worker.threads import fastest_count

    x = torch.randn(1, weight.shape[1])
    return fastest_count(lambda n: _kernel(x, weight, threads=n), budget, reps)[0]


def huge_page_weights(model: torch.nn.Module, min_bytes: int = 1 << 20) -> int:
    """Move ``model``'s float32 CPU matrices of at least ``min_bytes`` into one anonymous
    mapping backed by transparent huge pages (``MADV_HUGEPAGE``; the kernel's default here is
    ``madvise``), in module order, and return the bytes moved (0 where huge pages are not
    available). The CPU backend calls it unless ``CpuKernelConfig.huge_pages`` is off.

    Batch-1 decode streams every weight once per token, and with 4 KiB pages the hardware
    prefetcher stops at every page, so one thread reads huge-paged memory much faster (a plain
    vector sum, and the GEMV follows it; docs/benchmarks.md). torch's allocator gives large
    tensors 4 KiB pages. Each parameter keeps its object (its ``.data`` is swapped), so tied
    weights stay tied; the old storage is freed as it goes, so the peak is one matrix above the
    model."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return 0
    params: dict[int, list[torch.nn.Parameter]] = {}
    for p in model.parameters():  # unique objects; tied parameters share one
        if (p.dtype == torch.float32 and p.device.type == "cpu" and p.dim() == 2
                and p.is_contiguous() and p.numel() * 4 >= min_bytes):
            params.setdefault(p.data_ptr(), []).append(p)
    if not params:
        return 0
    # a storage seen under two shapes (a view of another weight) stays where it is
    params = {ptr: ps for ptr, ps in params.items() if all(p.shape == ps[0].shape for p in ps)}
    sizes = {ptr: ps[0].numel() * 4 for ptr, ps in params.items()}
    total = sum(-(-b // 64) * 64 for b in sizes.values())
    try:
        mm = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mm.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError) as e:
        logger.info("float weights stay on 4 KiB pages: %s", e)
        return 0
    arena = torch.frombuffer(mm, dtype=torch.uint8)  # keeps mm alive as long as any view
    off = (-arena.data_ptr()) % HUGE_PAGE
    for ptr, ps in params.items():
        nbytes = sizes[ptr]
        new = arena[off:off + nbytes].view(torch.float32).view(ps[0].shape)
        new.copy_(ps[0].data)
        for p in ps:
            p.data = new
        off += -(-nbytes // 64) * 64
    return sum(sizes.values())


def kernel_path() -> str | None:
    """The loaded kernel's file (its name carries the build key), None when not loaded."""
    return _kernel.path if _kernel is not None else None


def set_threads(n: int) -> None:
    global _threads
    _threads = max(1, min(256, n))


def threads() -> int:
    return _threads


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, through the kernel for a few rows of CPU float32 input."""
    k = _kernel
    if (k is not None and x.dim() == 2
            and (x.shape[0] <= MAX_ROWS or x.shape[0] <= max_kernel_rows())
            and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.device.type == "cpu" and x.stride(-1) == 1 and weight.is_contiguous()):
        return k(x, weight, bias, _threads)
    return F.linear(x, weight, bias)
