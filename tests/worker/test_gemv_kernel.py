"""The compiled float32 GEMV (aioengine.worker.gemv) against torch's F.linear: odd shapes, a
few rows, strided rows, bias, every thread count; its choice of threads; bad inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aioengine.worker import gemv


@pytest.fixture(scope="module")
def kernel() -> gemv.GemvKernel:
    return gemv.GemvKernel(str(gemv.ensure_built()))


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 13, 64])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 5), (33, 31), (96, 64), (200, 576), (1000, 1537)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_matches_torch_linear(kernel: gemv.GemvKernel, m: int, n: int, k: int,
                              threads: int) -> None:
    g = torch.Generator().manual_seed(n * 1000 + k + m)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    got = kernel(x, w, threads=threads)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("m", [1, 3, 9, 20])
@pytest.mark.parametrize("n,k", [(5, 15), (8, 16), (9, 17), (17, 33), (23, 47), (40, 64),
                                 (65, 95), (130, 576)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_code_path_matches_float64(kernel: gemv.GemvKernel, level: int, m: int, n: int,
                                         k: int, threads: int) -> None:
    """Each compiled path this CPU runs (portable, AVX2, AVX-512 with its 8-row groups and
    masked K tail) against a float64 product: row counts off the group of 8, K off 16 and 32,
    more x rows than a group holds (AVX2: 9 and 20 take the prefill tile's chunks of 6)."""
    if level > kernel.best_level:
        pytest.skip(f"this CPU lacks code path {level}")
    g = torch.Generator().manual_seed(n * 1000 + k * 10 + m)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    want = (x.double() @ w.double().T).float()
    got = kernel(x, w, threads=threads, level=level)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6 * k)


def test_a_missing_code_path_is_refused(kernel: gemv.GemvKernel) -> None:
    with pytest.raises(gemv.GemvError, match="lacks the requested code path"):
        kernel(torch.randn(1, 8), torch.randn(8, 8), level=3)


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


def test_every_row_count_takes_the_kernel_only_while_its_pool_outnumbers_torchs() -> None:
    torch_threads = torch.get_num_threads()
    assert gemv.configure("cpu", torch.float32, torch_threads)
    try:
        assert gemv.max_kernel_rows() == gemv.MAX_ROWS
        gemv.set_threads(torch_threads + 1)
        assert gemv.max_kernel_rows() > 1 << 30
        w, x = torch.randn(70, 100), torch.randn(300, 100)
        torch.testing.assert_close(gemv.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
        gemv.set_threads(torch_threads)
        assert gemv.max_kernel_rows() == gemv.MAX_ROWS
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


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "none"
    return text[text.index("[") + 1:text.index("]")]


def _huge_kib_at(addr: int) -> int:
    """AnonHugePages (KiB) of the mapping of this process that holds ``addr``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(a, 16) for a in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


def test_huge_page_weights_keeps_values_and_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    model = torch.nn.Module()
    model.a = torch.nn.Linear(576, 1024, bias=False)
    model.b = torch.nn.Linear(1024, 768, bias=True)
    model.small = torch.nn.Linear(8, 8)
    model.tied = torch.nn.Linear(576, 1024, bias=False)
    model.tied.weight = model.a.weight  # one parameter in two places
    for p in model.parameters():
        p.requires_grad_(False)
        p.copy_(torch.randn(p.shape, generator=g))
    before = {n: p.clone() for n, p in model.named_parameters(remove_duplicate=False)}
    small_ptr = model.small.weight.data_ptr()
    moved = gemv.huge_page_weights(model)
    if _thp_mode() in ("none", "never"):
        pytest.skip("no transparent huge pages on this machine")
    assert moved == (1024 * 576 + 768 * 1024) * 4  # the two big matrices, the tied one once
    for n, p in model.named_parameters(remove_duplicate=False):
        assert torch.equal(p, before[n]), n
    assert model.tied.weight is model.a.weight
    assert model.small.weight.data_ptr() == small_ptr  # under min_bytes: left alone
    assert model.a.weight.data_ptr() % 64 == 0 and model.b.weight.data_ptr() % 64 == 0
    assert _huge_kib_at(model.a.weight.data_ptr()) >= 2048
