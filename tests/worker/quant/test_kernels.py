"""The quantized C kernels against a float64 reference (the ``gguf`` package's own dequantizer,
then a matmul): every block type, the scalar, AVX2 and AVX-512 paths, float32 and int16
activations, 1 and 2 threads, odd shapes and the bad inputs each check names."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from aioengine.worker.quant import QTYPES, QuantKernelError, load_quant_kernel, qtype_of, quantize

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

TYPES = sorted(QTYPES)


@pytest.fixture(scope="module")
def kern():
    return load_quant_kernel()


def levels(kern) -> list[int]:
    """Every code path this CPU runs: scalar, AVX2, AVX-512."""
    return list(range(kern.best_level + 1))


def gtype(name: str):
    return getattr(gguf.GGMLQuantizationType, name.upper())


def blocks_of(name: str, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Real blocks of random weights, and their float64 values by gguf's dequantizer."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 1.0, (n, 1))).astype(np.float32)
    b = quantize(w, name)
    return b, gguf_dequantize(b, gtype(name)).astype(np.float64)


def check_close(got: np.ndarray, x: np.ndarray, wref: np.ndarray, rel: float = 1e-5) -> None:
    """Error bound: ``rel`` of sum |x| |w| per output (float32 accumulation: 1e-5; 16-bit
    activations: 1e-4)."""
    ref = x.astype(np.float64) @ wref.T
    bound = rel * (np.abs(x).astype(np.float64) @ np.abs(wref).T) + 1e-6
    assert np.all(np.abs(got - ref) <= bound), float(np.max(np.abs(got - ref) - bound))


@pytest.mark.parametrize("name", TYPES)
def test_matmul_matches_the_dequantized_reference(kern, name):
    qt = QTYPES[name]
    rng = np.random.default_rng(1)
    for n, nblocks in ((1, 1), (37, 1), (13, 9), (130, 3)):
        k = nblocks * qt.block
        b, wref = blocks_of(name, n, k, seed=n)
        wt = torch.from_numpy(b)
        for m in (1, 2, 7, 64):
            x = rng.standard_normal((m, k)).astype(np.float32)
            for level in levels(kern):
                for threads in (1, 2):
                    for act, rel in (("float32", 1e-5), ("int16", 1e-4)):
                        out = torch.full((m, n), float("nan"))
                        kern.matmul(qt, torch.from_numpy(x), wt, out, threads=threads,
                                    level=level, activations=act)
                        check_close(out.numpy(), x, wref, rel)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_is_exactly_ggufs(kern, name):
    qt = QTYPES[name]
    b, wref = blocks_of(name, 11, 2 * qt.block)
    for level in levels(kern):
        for threads in (1, 2):
            got = kern.dequantize(qt, torch.from_numpy(b), 2 * qt.block, threads=threads,
                                  level=level)
            np.testing.assert_array_equal(got.numpy(), wref.astype(np.float32))


def test_output_into_a_column_slice_and_strided_x(kern):
    qt = QTYPES["q4_k"]
    b, wref = blocks_of("q4_k", 9, 512)
    wide = torch.zeros(3, 20)
    xs = torch.randn(3, 600)[:, :512]  # row stride 600
    kern.matmul(qt, xs, torch.from_numpy(b), wide[:, 5:14])
    check_close(wide[:, 5:14].numpy(), xs.numpy(), wref)
    assert (wide[:, :5] == 0).all() and (wide[:, 14:] == 0).all()  # nothing outside the slice


def test_many_calls_with_changing_thread_counts(kern):
    """The pool grows and shrinks its share per call; every call sees all its rows done."""
    qt = QTYPES["q8_0"]
    b, wref = blocks_of("q8_0", 301, 256)
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    for i in range(300):
        out = torch.full((1, 301), float("nan"))
        kern.matmul(qt, torch.from_numpy(x), torch.from_numpy(b), out, threads=1 + i % 3)
        check_close(out.numpy(), x, wref)


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_reference_quantizers_are_byte_equal_to_gguf(name):
    w = np.random.default_rng(3).standard_normal((17, 256)).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block
    np.testing.assert_array_equal(quantize(w, name), gguf_quantize(w, gtype(name)))


@pytest.mark.parametrize("name,rel", [("q2_k", 0.3), ("q3_k", 0.2), ("q4_k", 0.09), ("q5_k", 0.045),
                                      ("q6_k", 0.02)])
def test_k_quantizers_round_trip_through_ggufs_dequantizer(name, rel):
    w = np.random.default_rng(4).standard_normal((8, 512)).astype(np.float32)
    w[1] = 0.0
    w[2] = np.abs(w[2])  # all positive: Q4_K's min is 0
    back = gguf_dequantize(quantize(w, name), gtype(name))
    err = np.abs(back - w).max(axis=1)
    assert np.all(err <= rel * np.abs(w).max(axis=1) + 1e-7), err


def test_bad_inputs_name_the_problem(kern):
    qt = QTYPES["q4_0"]
    b, _ = blocks_of("q4_0", 4, 64)
    w = torch.from_numpy(b)
    x = torch.randn(1, 64)
    out = torch.empty(1, 4)
    with pytest.raises(QuantKernelError, match="take 36 bytes, got rows of 35 bytes"):
        kern.matmul(qt, x, w[:, :35].contiguous(), out)
    with pytest.raises(QuantKernelError, match="whole blocks of 32 values; a row of 48"):
        kern.matmul(qt, torch.randn(1, 48), w, out)
    with pytest.raises(QuantKernelError, match="uint8"):
        kern.matmul(qt, x, w.to(torch.int16), out)
    with pytest.raises(QuantKernelError, match="float32"):
        kern.matmul(qt, x.double(), w, out)
    with pytest.raises(QuantKernelError, match="out has 2 rows, x has 1"):
        kern.matmul(qt, x, w, torch.empty(2, 4))
    with pytest.raises(QuantKernelError, match="expected 5 rows, got 4"):
        kern.matmul(qt, x, w, torch.empty(1, 5))
    with pytest.raises(QuantKernelError, match="level must be one of"):
        kern.matmul(qt, x, w, out, level=7)
    with pytest.raises(QuantKernelError, match="thread count"):
        kern.matmul(qt, x, w, out, threads=0)
    with pytest.raises(ValueError, match=r"'iq4_nl' is not supported.*supported: \['q2_k'"):
        qtype_of("iq4_nl")
    with pytest.raises(ValueError, match="whole blocks of 256"):
        quantize(np.zeros((2, 100), np.float32), "q4_k")
    with pytest.raises(ValueError, match="NaN"):
        quantize(np.full((1, 32), np.nan, np.float32), "q8_0")


FP16_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2),
               "q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}
"""Byte offsets of each type's fp16 scales (d, and the min / dmin) in a block; every other
byte of every type is a free field (quantized values, high bits, packed scales)."""


def random_blocks(name: str, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Blocks written field by field, no quantizer: random bytes everywhere, random finite fp16
    scales; edge blocks: all bits set (every value, scale and min at its largest), all zero,
    a zero d, a subnormal d, a negative d. Returns them and gguf's float64 values."""
    qt = QTYPES[name]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (n, k // qt.block, qt.bytes), dtype=np.uint8)
    fp16 = (rng.choice([-1.0, 1.0], (n, k // qt.block, len(FP16_FIELDS[name])))
            * 10.0 ** rng.uniform(-4, 0.3, (n, k // qt.block, len(FP16_FIELDS[name]))))
    edge = [np.float16(0.0), np.float16(6e-8), np.float16(-0.5)]  # 6e-8: a subnormal
    flat = b.reshape(-1, qt.bytes)
    f16 = fp16.astype(np.float16).reshape(flat.shape[0], -1)
    for i in range(min(len(flat), 5)):
        if i == 0:
            flat[i] = 0xFF
            f16[i] = 1.0
        elif i == 1:
            flat[i] = 0
        else:
            f16[i, 0] = edge[i - 2]
    for j, off in enumerate(FP16_FIELDS[name]):
        flat[:, off:off + 2] = f16[:, j:j + 1].view(np.uint8)
    b = flat.reshape(n, -1)
    return b, gguf_dequantize(b, gtype(name)).astype(np.float64)


@pytest.mark.parametrize("name", TYPES)
def test_blocks_from_random_fields_and_edge_values(kern, name):
    """Blocks no quantizer would write (every bit pattern, extreme scales and mins, zero and
    subnormal scales) dequantize to exactly gguf's values and multiply within the bound, in
    the row layout and the x8 layout, on every path and with 1 and 3 threads."""
    qt = QTYPES[name]
    rng = np.random.default_rng(8)
    for n, nb in ((1, 1), (11, 2), (37, 5)):
        k = nb * qt.block
        b, wref = random_blocks(name, n, k, seed=n)
        w = torch.from_numpy(b)
        x8 = kern.repack_x8(qt, w, k)
        assert torch.equal(kern.unpack_x8(qt, x8, n, k), w)
        for m in (1, 5):
            x = rng.standard_normal((m, k)).astype(np.float32)
            for level in levels(kern):
                for threads in (1, 3):
                    got = kern.dequantize(qt, w, k, threads=threads, level=level)
                    np.testing.assert_array_equal(got.numpy(), wref.astype(np.float32))
                    got = kern.dequantize_x8(qt, x8, n, k, threads=threads, level=level)
                    np.testing.assert_array_equal(got.numpy(), wref.astype(np.float32))
                    for act, rel in (("float32", 1e-5), ("int16", 1e-4)):
                        out = torch.full((m, n), float("nan"))
                        kern.matmul(qt, torch.from_numpy(x), w, out, threads=threads,
                                    level=level, activations=act)
                        check_close(out.numpy(), x, wref, rel)
                    out = torch.full((m, n), float("nan"))
                    kern.matmul_x8(qt, torch.from_numpy(x), x8, out, threads=threads, level=level)
                    check_close(out.numpy(), x, wref, 1e-4)


@pytest.mark.parametrize("name", TYPES)
def test_rows_whose_bytes_do_not_fit_the_type_are_refused_in_python(kern, name):
    """A weight whose byte size does not match its type and shape is a QuantKernelError naming
    the sizes, from every entry point, before any C code reads it."""
    qt = QTYPES[name]
    k = 2 * qt.block
    b, _ = blocks_of(name, 9, k)
    short = torch.from_numpy(np.ascontiguousarray(b[:, :-1]))
    rb = qt.row_bytes(k)
    msg = f"{name} rows of K={k} values take {rb} bytes, got rows of {rb - 1} bytes"
    with pytest.raises(QuantKernelError, match=msg):
        kern.matmul(qt, torch.randn(1, k), short, torch.empty(1, 9))
    with pytest.raises(QuantKernelError, match=msg):
        kern.dequantize(qt, short, k)
    with pytest.raises(QuantKernelError, match=msg):
        kern.repack_x8(qt, short, k)
    x8 = kern.repack_x8(qt, torch.from_numpy(b), k)
    cut = x8[:-1].contiguous()
    msg8 = f"9 {name} rows of {k} values take {x8.numel()} bytes in the x8 layout, got " \
           f"{x8.numel() - 1}"
    with pytest.raises(QuantKernelError, match=msg8):
        kern.matmul_x8(qt, torch.randn(1, k), cut, torch.empty(1, 9))
    with pytest.raises(QuantKernelError, match=msg8):
        kern.unpack_x8(qt, cut, 9, k)
    with pytest.raises(QuantKernelError, match=msg8):
        kern.dequantize_x8(qt, cut, 9, k)
    from aioengine.worker.quant.weight import QuantizedWeight, QuantPolicy

    qw = QuantizedWeight(9, k, QuantPolicy("gguf"), kern)
    with pytest.raises(ValueError, match=f"{name} rows of {k} values must be uint8 \\[9, {rb}\\]"):
        qw.set_rows(0, qt, short)


def test_scalar_fallback_is_what_a_cpu_without_avx2_gets(kern):
    """The best level is probed from CPUID; the scalar path computes the same numbers."""
    assert kern.best_level in (0, 1, 2)
    b, wref = blocks_of("q6_k", 8, 256)
    x = torch.randn(1, 256)
    a = torch.empty(1, 8)
    kern.matmul(QTYPES["q6_k"], x, torch.from_numpy(b), a, level=0)
    check_close(a.numpy(), x.numpy(), wref)


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1"])
def test_int8_activations_match_their_own_reference(kern, name):
    """8-bit activations: x rounded per 32 values (scale amax/127) exactly as the kernel does,
    then the exact product; and the error against float x is the rounding's, not more."""
    qt = QTYPES[name]
    b, wref = blocks_of(name, 29, 256)
    rng = np.random.default_rng(5)
    for m in (1, 3):
        x = rng.standard_normal((m, 256)).astype(np.float32)
        xb = x.reshape(m, -1, 32)
        d = np.abs(xb).max(-1, keepdims=True).astype(np.float32) / np.float32(127)
        inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
        xq = (np.sign(xb * inv) * np.floor(np.abs(xb * inv) + 0.5)) * d
        for level in levels(kern):
            for threads in (1, 2):
                out = torch.empty(m, 29)
                kern.matmul(qt, torch.from_numpy(x), torch.from_numpy(b), out, threads=threads,
                            level=level, activations="int8")
                check_close(out.numpy(), xq.reshape(m, 256).astype(np.float32), wref)
        exact = x.astype(np.float64) @ wref.T
        assert np.abs(out.numpy() - exact).max() > 1e-5 * np.abs(exact).max()  # x was rounded


def test_int8_activations_refuse_k_quants(kern):
    b, _ = blocks_of("q4_k", 2, 256)
    with pytest.raises(QuantKernelError, match="int8 activations are implemented for q8_0"):
        kern.matmul(QTYPES["q4_k"], torch.randn(1, 256), torch.from_numpy(b), torch.empty(1, 2),
                    activations="int8")
    b5, _ = blocks_of("q5_0", 2, 64)
    with pytest.raises(QuantKernelError, match="int8 activations are implemented for q8_0"):
        kern.matmul(QTYPES["q5_0"], torch.randn(1, 64), torch.from_numpy(b5), torch.empty(1, 2),
                    activations="int8")
    with pytest.raises(QuantKernelError, match="activations must be one of"):
        kern.matmul(QTYPES["q4_k"], torch.randn(1, 256), torch.from_numpy(b), torch.empty(1, 2),
                    activations="int4")


@pytest.mark.parametrize("name", TYPES)
def test_int16_activations_are_within_a_tight_bound(kern, name):
    """16-bit activations per 32 values: the product is within 1e-4 of sum |x| |w| of the exact
    float64 one (8-bit activations miss by ~1e-2), on every path and thread count."""
    qt = QTYPES[name]
    for n, nblocks in ((1, 1), (23, 3)):
        k = nblocks * qt.block
        b, wref = blocks_of(name, n, k, seed=n + 7)
        x = np.random.default_rng(n).standard_normal((3, k)).astype(np.float32)
        x[0, :32] *= 1e-3  # a small block next to large ones keeps its own scale
        bound = 1e-4 * (np.abs(x).astype(np.float64) @ np.abs(wref).T) + 1e-7
        ref = x.astype(np.float64) @ wref.T
        for level in levels(kern):
            for threads in (1, 2):
                out = torch.empty(3, n)
                kern.matmul(qt, torch.from_numpy(x), torch.from_numpy(b), out, threads=threads,
                            level=level, activations="int16")
                assert np.all(np.abs(out.numpy() - ref) <= bound), (level, threads)


def test_concurrent_callers_share_the_pool(kern):
    """Two Python threads calling at once (the C call releases the GIL): each call still gets
    all its rows, computed once."""
    import threading

    qt = QTYPES["q4_1"]
    b, wref = blocks_of("q4_1", 257, 128)
    x = np.random.default_rng(6).standard_normal((1, 128)).astype(np.float32)
    bad = []

    def caller() -> None:
        for _ in range(200):
            out = torch.full((1, 257), float("nan"))
            kern.matmul(qt, torch.from_numpy(x), torch.from_numpy(b), out, threads=3,
                        activations="float32")
            ref = x.astype(np.float64) @ wref.T
            if not np.allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4):
                bad.append(out)

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
