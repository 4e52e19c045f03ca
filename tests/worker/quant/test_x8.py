"""The interleaved x8 layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: 8 rows' blocks side
by side, made at load):
the repack round-trips byte for byte, dequantizes to exactly gguf's values, and its GEMV /
small-M product matches the float64 reference on every code path (scalar, AVX2, AVX-512 VNNI),
thread count and odd shape (rows not a multiple of 8: the last group is padded)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from aioengine.worker.quant import QTYPES, QuantKernelError, load_quant_kernel, quantize
from aioengine.worker.quant.kernel import X8_TILE_MIN_M, X8_TYPES, QType
from aioengine.worker.quant.quantize import q5_0_as_q8_0
from aioengine.worker.quant.weight import QuantizedWeight, QuantPolicy

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


@pytest.fixture(scope="module")
def kern():
    return load_quant_kernel()


def blocks_of(name: str, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 1.0, (n, 1))).astype(np.float32)
    b = quantize(w, name)
    return b, gguf_dequantize(b, getattr(gguf.GGMLQuantizationType, name.upper())).astype(
        np.float64)


@pytest.mark.parametrize("name", X8_TYPES)
def test_repack_round_trips_and_dequantizes_exactly(kern, name):
    qt = QTYPES[name]
    for n, nb in ((1, 1), (8, 2), (13, 3), (37, 18 if qt.block == 32 else 6)):
        k = qt.block * nb
        b, wref = blocks_of(name, n, k, seed=n)
        rows = torch.from_numpy(b)
        x8 = kern.repack_x8(qt, rows, k)
        # the file's bytes (rows padded to 8); Q4_K's and Q5_K's unpacked 6-bit scales take 4
        # bytes more, Q2_K's unpacked scales and mins 16, Q3_K's scales 4 and its nibbles 32
        extra = {"q4_k": 4, "q5_k": 4, "q2_k": 16, "q3_k": 36}.get(name, 0) * (k // 256)
        assert x8.numel() == kern.x8_bytes(qt, n, k) == (n + 7) // 8 * 8 * (qt.row_bytes(k)
                                                                             + extra)
        assert torch.equal(kern.unpack_x8(qt, x8, n, k), rows)
        for threads in (1, 2):
            got = kern.dequantize_x8(qt, x8, n, k, threads=threads).numpy()
            assert np.array_equal(got, wref.astype(np.float32))
        # single rows (an embedding lookup): any order, repeats, the last group's lanes
        ids = torch.tensor([n - 1, 0, n // 2, n - 1, 7 % n], dtype=torch.int64)
        assert np.array_equal(kern.rows_x8(qt, x8, n, k, ids).numpy(),
                              wref.astype(np.float32)[ids.numpy()])


@pytest.mark.parametrize("name", X8_TYPES)
def test_x8_matmul_matches_the_reference_on_every_path(kern, name):
    qt = QTYPES[name]
    rng = np.random.default_rng(3)
    for n, nb in ((1, 1), (7, 2), (9, 1), (37, 3), (130, 18 if qt.block == 32 else 6)):
        k = qt.block * nb
        b, wref = blocks_of(name, n, k, seed=n + 1)
        x8 = kern.repack_x8(qt, torch.from_numpy(b), k)
        for m in (1, 2, 3, 4, 5, 15):
            x = rng.standard_normal((m, k)).astype(np.float32)
            x[0, :32] *= 1e-3  # a small block next to large ones keeps its own scale
            ref = x.astype(np.float64) @ wref.T
            bound = 1e-4 * (np.abs(x).astype(np.float64) @ np.abs(wref).T) + 1e-7
            rows_out = torch.empty(m, n)
            kern.matmul(qt, torch.from_numpy(x), torch.from_numpy(b), rows_out,
                        activations="int16")
            for level in range(kern.best_level + 1):
                for threads in (1, 2, 3):
                    out = torch.full((m, n), float("nan"))
                    kern.matmul_x8(qt, torch.from_numpy(x), x8, out, threads=threads,
                                   level=level)
                    assert np.all(np.abs(out.numpy() - ref) <= bound), (n, k, m, level, threads)
                    # the same integer products as the row layout's int16 path
                    np.testing.assert_allclose(out.numpy(), rows_out.numpy(), rtol=1e-5,
                                               atol=1e-5 * float(np.abs(ref).max()))


def test_x8_into_a_column_slice(kern):
    qt = QTYPES["q4_1"]
    b, wref = blocks_of("q4_1", 21, 64)
    x8 = kern.repack_x8(qt, torch.from_numpy(b), 64)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    wide = torch.full((3, 40), 7.0)
    kern.matmul_x8(qt, x, x8, wide[:, 5:26], threads=2)
    assert torch.all(wide[:, :5] == 7.0) and torch.all(wide[:, 26:] == 7.0)
    ref = x.double().numpy() @ wref.T
    # Relative to the outputs' scale: the activations are rounded to 8 bits, so the absolute
    # error grows with them (an absolute 1e-3 failed for ~1 random input in 9; 300 seeds stayed
    # under 1.3e-4 of the largest output).
    assert np.abs(wide[:, 5:26].numpy() - ref).max() < 5e-4 * np.abs(ref).max()


def test_x8_bad_inputs_name_the_problem(kern):
    qt = QTYPES["q4_0"]
    b, _ = blocks_of("q4_0", 9, 64)
    x8 = kern.repack_x8(qt, torch.from_numpy(b), 64)
    with pytest.raises(QuantKernelError, match="iq4_nl has no x8 layout"):
        kern.repack_x8(QType("iq4_nl", 20, 32, 18), torch.zeros(1, 18, dtype=torch.uint8), 32)
    with pytest.raises(QuantKernelError, match="whole blocks of 256 values; a row of 96"):
        kern.matmul_x8(QTYPES["q4_k"], torch.randn(1, 96), x8, torch.empty(1, 9))
    with pytest.raises(QuantKernelError, match="take 576 bytes in the x8 layout, got 575"):
        kern.matmul_x8(qt, torch.randn(1, 64), x8[:575].contiguous(), torch.empty(1, 9))
    with pytest.raises(QuantKernelError, match="x8 weights must be a contiguous 1-D"):
        kern.matmul_x8(qt, torch.randn(1, 64), x8.view(2, -1), torch.empty(1, 9))
    with pytest.raises(QuantKernelError, match="out has 2 rows, x has 1"):
        kern.matmul_x8(qt, torch.randn(1, 64), x8, torch.empty(2, 9))
    with pytest.raises(QuantKernelError, match="whole blocks of 32 values; a row of 48"):
        kern.matmul_x8(qt, torch.randn(1, 48), x8, torch.empty(1, 9))
    with pytest.raises(QuantKernelError, match="thread count"):
        kern.matmul_x8(qt, torch.randn(1, 64), x8, torch.empty(1, 9), threads=0)
    with pytest.raises(QuantKernelError,
                       match=r"a row id outside the weight's rows \(ids 2\.\.9, 9 rows\)"):
        kern.rows_x8(qt, x8, 9, 64, torch.tensor([2, 9]))
    with pytest.raises(QuantKernelError, match="ids must be a contiguous 1-D CPU int64"):
        kern.rows_x8(qt, x8, 9, 64, torch.tensor([2], dtype=torch.int32))


@pytest.mark.parametrize("name", X8_TYPES)
def test_weight_switches_layout_with_the_policy(kern, name):
    """A QuantizedWeight repacks on first int16 use, goes back to rows for float32/int8
    activations, and every layout gives the same products (prefill through dequantize too)."""
    qt = QTYPES[name]
    k = 3 * qt.block
    b, wref = blocks_of(name, 50, k, seed=4)
    qw = QuantizedWeight(50, k, QuantPolicy(name), kern)
    qw.set_rows(0, qt, torch.from_numpy(b[:20].copy()))
    qw.set_rows(20, qt, torch.from_numpy(b[20:].copy()))
    x = torch.randn(3, k)
    ref = x.double().numpy() @ wref.T
    tol = 1e-3 * float(np.abs(ref).max())
    a = qw(x)
    assert qw.segments[0].x8 and len(qw.segments) == 1
    assert np.abs(a.numpy() - ref).max() < tol
    assert np.abs(qw(torch.randn(20, k)).numpy()).max() > 0  # the sgemm path on x8
    assert np.array_equal(qw.dequantize().numpy(), wref.astype(np.float32))
    for act in ("float32", "int8", "int16"):
        qw.policy = QuantPolicy(name, activations=act)
        got = qw(x)
        # int8 applies to q8_0/q4_0/q4_1 (the K-quants and Q5_1 keep int16: x8); a Q5_0
        # segment became Q8_0 rows under float32
        int16 = act == "int16" or (act == "int8" and name not in ("q8_0", "q4_0", "q4_1",
                                                                  "q5_0"))
        assert qw.segments[0].x8 == int16
        assert np.abs(got.numpy() - ref).max() < (1e-3 if int16 or act == "float32" else 0.05) \
            * float(np.abs(ref).max())
    qw.policy = QuantPolicy(name, x8=False)
    # Q5_0 has scalar row kernels only: the row layout runs the Q8_0 blocks of its values
    rqt, rows = (QTYPES["q8_0"], q5_0_as_q8_0(b)) if name == "q5_0" else (qt, b)
    assert torch.equal(qw(x), qw.kernel.matmul(rqt, x, torch.from_numpy(rows),
                                               torch.empty(3, 50), activations="int16"))
    assert not qw.segments[0].x8 and torch.equal(qw.segments[0].data, torch.from_numpy(rows))
    assert qw.segments[0].qtype is rqt


def test_decode_plan_matches_the_checked_path(kern):
    """After the first small-M call a weight's segments run as one C call (qk_matmul_segs):
    the same bits as the per-segment calls, for mixed types and layouts, rebuilt when the
    policy or the rows change; inputs it cannot take go through the checked path."""
    k = 256
    parts = [("q4_1", 24), ("q4_k", 16), ("q8_0", 9), ("q6_k", 8)]
    qw = QuantizedWeight(57, k, QuantPolicy("gguf"), kern)
    refs, off = [], 0
    for i, (name, n) in enumerate(parts):
        b, wref = blocks_of(name, n, k, seed=10 + i)
        qw.set_rows(off, QTYPES[name], torch.from_numpy(b))
        refs.append(wref)
        off += n
    wref = np.concatenate(refs)
    for act in ("int16", "float32"):
        qw.policy = QuantPolicy("gguf", activations=act)
        for m in (1, 3):
            x = torch.randn(m, k)
            first = qw(x)  # checked per-segment path, makes the plan
            assert qw._plan is not None and qw._plan.policy is qw.policy
            assert torch.equal(qw(x), first)  # the plan: bit-equal
            ref = x.double().numpy() @ wref.T
            assert np.abs(first.numpy() - ref).max() < 1e-3 * float(np.abs(ref).max())
            wide = torch.randn(m, 2 * k)[:, :k]  # strided rows: the checked path
            assert torch.equal(qw(wide), qw(wide.contiguous()))
    with pytest.raises(QuantKernelError, match=r"expected CPU activations \[..., 256\]"):
        qw(torch.randn(1, 128))
    b, wnew = blocks_of("q4_1", 24, k, seed=99)
    qw.set_rows(0, QTYPES["q4_1"], torch.from_numpy(b))  # new rows: the plan is dropped
    assert qw._plan is None
    x = torch.randn(1, k)
    ref = x.double().numpy() @ np.concatenate([wnew, *refs[1:]]).T
    qw(x)
    got = qw(x)
    assert np.abs(got.numpy() - ref).max() < 1e-4 * float(np.abs(ref).max())


def test_quant_isa_caps_the_code_path(kern):
    """``set_max_isa("avx2")`` (``CpuKernelConfig.quant_isa``) makes the best-level calls run
    the AVX2 kernels (what AVX2-only CPUs run) — bit-equal to asking for level 1; a bad value
    is named."""
    if kern.best_level < 1:
        pytest.skip("needs an AVX2 CPU")
    best = kern.best_level
    qt = QTYPES["q4_1"]
    b, _ = blocks_of("q4_1", 40, 128, seed=3)
    x8 = kern.repack_x8(qt, torch.from_numpy(b), 128)
    x = torch.randn(1, 128)
    want = kern.matmul_x8(qt, x, x8, torch.empty(1, 40), level=1)
    try:
        kern.set_max_isa("avx2")  # the cap is the loaded library's (process-wide)
        assert kern.best_level == 1
        assert torch.equal(kern.matmul_x8(qt, x, x8, torch.empty(1, 40)), want)
        with pytest.raises(QuantKernelError, match="quant_isa='sse9': expected one of"):
            kern.set_max_isa("sse9")
    finally:
        kern.set_max_isa("best")
    assert kern.best_level == best


@pytest.mark.parametrize("name", X8_TYPES)
def test_two_group_tile_is_bit_identical_to_the_one_group_kernel(kern, name):
    """The tile that computes two groups x 4 rows per pass (M > 1: batched decode, prefill)
    gives the one-group kernel's outputs bit for bit, on every path, thread count, odd row count
    (a lone last group, a padded one) and M across several M-blocks (K=1536: 68-row blocks).
    K-quants (256-value blocks) run one group at a time at every M: the same check holds."""
    assert kern.x8_tile() == X8_TILE_MIN_M  # the library's default is the documented one
    qt = QTYPES[name]
    rng = np.random.default_rng(7)
    try:
        for n, nb in ((8, 1), (23, 2), (40, 5), (129, 48)):
            k = 32 * nb if qt.block == 32 else 256 * max(1, nb // 8)
            b, wref = blocks_of(name, n, k, seed=n + 2)
            x8 = kern.repack_x8(qt, torch.from_numpy(b), k)
            for m in (2, 3, 4, 5, 9, 150):
                if m == 150 and nb != 48:
                    continue
                x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
                ref = x.double().numpy() @ wref.T
                bound = 1e-4 * (np.abs(x.double().numpy()) @ np.abs(wref).T) + 1e-7
                for level in range(kern.best_level + 1):
                    for threads in (1, 2, 3):
                        outs = []
                        for min_m in (2, 1 << 30):
                            kern.set_x8_tile(min_m)
                            outs.append(kern.matmul_x8(qt, x, x8, torch.full((m, n), np.nan),
                                                       threads=threads, level=level))
                        assert torch.equal(outs[0], outs[1]), (n, k, m, level, threads)
                        assert np.all(np.abs(outs[0].numpy() - ref) <= bound)
    finally:
        kern.set_x8_tile(X8_TILE_MIN_M)
    with pytest.raises(QuantKernelError, match="min_m must be an int >= 1, got 0"):
        kern.set_x8_tile(0)


@pytest.mark.parametrize("name", X8_TYPES)
def test_prefill_runs_the_x8_kernels(kern, name):
    """From sgemm_min_rows rows on, x8 weights still compute with the x8 kernels (int16
    activations, through the one-call plan) unless x8_prefill is off: then a dequantized copy and
    torch's sgemm. Both match the reference; the x8 one equals the kernel called directly."""
    qt = QTYPES[name]
    k = 192 if qt.block == 32 else 512
    b, wref = blocks_of(name, 45, k, seed=5)
    x = torch.randn(70, k)
    ref = x.double().numpy() @ wref.T
    bound = 1e-4 * (np.abs(x.double().numpy()) @ np.abs(wref).T) + 1e-6
    outs = {}
    for on in (True, False):
        qw = QuantizedWeight(45, k, QuantPolicy(name, x8_prefill=on), kern)
        qw.set_rows(0, qt, torch.from_numpy(b[:30].copy()))
        qw.set_rows(30, qt, torch.from_numpy(b[30:].copy()))
        outs[on] = qw(x)
        assert np.all(np.abs(outs[on].numpy() - ref) <= bound), on
        assert qw(x.view(7, 10, k)).shape == (7, 10, 45)
        assert (qw._plan is not None and qw._plan.any_m) == (on and kern.best_level >= 1)
        assert qw.segments[0].x8 == (on and kern.best_level >= 1)
    if kern.best_level >= 1:
        direct = kern.matmul_x8(qt, x, kern.repack_x8(qt, torch.from_numpy(b), k),
                                torch.empty(70, 45))
        assert torch.equal(outs[True], direct)
        assert not torch.equal(outs[True], outs[False])  # int16 activations vs float sgemm
