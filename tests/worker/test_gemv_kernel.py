"""The compiled float32 GEMV (aioengine.worker.gemv) against torch's F.linear: odd shapes, a
few rows, strided rows, bias, every thread count; its choice of threads; bad inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aioengine.worker import gemv


@pytest.fixture(scope="module")
def kernel() -> gemv.GemvKernel:
    return gemv.GemvKernel(str(gemv.ensure_built()))


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 5), (33, 31), (96, 64), (200, 576), (1000, 1537)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_matches_torch_linear(kernel: gemv.GemvKernel, m: int, n: int, k: int,
                              threads: int) -> None:
    g = torch.Generator().manual_seed(n * 1000 + k + m)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    got = kernel(x, w, threads=threads)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-4 * k ** 0.5)


def test_strided_rows_and_bias(kernel: gemv.GemvKernel) -> None:
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(4, 300, generator=g)
    x = wide[:, 10:110]  # rows 300 apart, columns contiguous
    w = torch.randn(70, 100, generator=g)
    b = torch.randn(70, generator=g)
    torch.testing.assert_close(kernel(x, w, b, threads=2), F.linear(x, w, b))


def test_linear_takes_the_kernel_only_for_a_few_float32_rows() -> None:
    assert gemv.configure("cpu", torch.float32, 2)
    try:
        w = torch.randn(64, 32)
        for m in (1, gemv.MAX_ROWS, gemv.MAX_ROWS + 1):
            x = torch.randn(m, 32)
            torch.testing.assert_close(gemv.linear(x, w), F.linear(x, w))
        xb, wb = torch.randn(1, 32, dtype=torch.bfloat16), w.bfloat16()
        torch.testing.assert_close(gemv.linear(xb, wb), F.linear(xb, wb))  # torch's path
        assert not gemv.configure("cpu", torch.bfloat16, 2)
    finally:
        gemv.configure("cpu", torch.float32, 1)


def test_calibrated_threads_are_within_the_budget() -> None:
    w = torch.randn(4096, 256)
    for budget in (1, 2, 3):
        n = gemv.calibrate_threads(w, budget)
        assert 1 <= n <= budget


@pytest.mark.parametrize("x,w,message", [
    (torch.randn(1, 8, dtype=torch.float64), torch.randn(4, 8), "must be float32"),
    (torch.randn(1, 8), torch.randn(8, 4).t(), "contiguous"),
    (torch.randn(1, 7), torch.randn(4, 8), r"x must be \[M >= 1, 8\]"),
    (torch.randn(8, 2).t(), torch.randn(4, 8), "contiguous rows"),
    (torch.randn(8), torch.randn(4, 8), r"x must be \[M >= 1, 8\]"),
])
def test_bad_inputs_are_named(kernel: gemv.GemvKernel, x: torch.Tensor, w: torch.Tensor,
                              message: str) -> None:
    with pytest.raises(gemv.GemvError, match=message):
        kernel(x, w)


def test_bad_thread_count_is_refused(kernel: gemv.GemvKernel) -> None:
    with pytest.raises(gemv.GemvError, match="thread count"):
        kernel(torch.randn(1, 8), torch.randn(64, 8), threads=0)
